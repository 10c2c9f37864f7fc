"""The configs fairseq-hydra-train composes a ConvS2S run from, in hydra's ConfigStore.

fairseq-hydra-train composes its config before it imports ``common.user_dir``, so a recipe
YAML names this package in its search path (``hydra: searchpath: [pkg://fairseq_convs2s_ext]``),
which makes hydra import it while composing. Importing it registers:

- ``model=ARCH`` for every architecture (``models/convs2s.py``): a complete
  ``ConvS2SConfig``, so ``model.encoder_layers=...`` needs no ``+``;
- ``fairseq_with_convs2s``: fairseq's own ``FairseqConfig`` with ``common.user_dir`` set to
  this package, the base of every recipe (``defaults: [fairseq_with_convs2s, _self_]``). It
  has a name of its own because fairseq-hydra-train stores ``FairseqConfig`` under the name of
  the primary config too, which makes hydra warn that the YAML "is validated against
  ConfigStore schema with the same name" whenever the YAML lies at the top of the config folder.
"""
from fairseq.dataclass.configs import CommonConfig, FairseqConfig
from hydra.core.config_store import ConfigStore

BASE_CONFIG = "fairseq_with_convs2s"


def register_base_config(user_dir: str):
    ConfigStore.instance().store(name=BASE_CONFIG, node=FairseqConfig(common=CommonConfig(user_dir=user_dir)),
                                 provider="fairseq_convs2s_ext")
