"""ConvS2S (Gehring et al., 2017) as a fairseq plugin: `--user-dir fairseq_convs2s_ext`."""
from setuptools import find_packages, setup

setup(
    name="fairseq-convs2s-ext",
    version="0.1.0",
    description="Convolutional Sequence to Sequence Learning (Gehring et al., 2017) for fairseq",
    python_requires=">=3.9",
    packages=find_packages(include=["fairseq_convs2s_ext*", "preprocess*", "recipes*"]),
    include_package_data=True,
    install_requires=[
        # Official fairseq 0.12.2 does not import on Python 3.11; fairseq-fixed is
        # the same code with that fixed (and pins hydra-core 1.3.2, omegaconf 2.3.0).
        "fairseq-fixed==0.12.3.1",
        "torch>=2.0",
        "sacrebleu>=2.0",
        "subword-nmt>=0.3.8",
        "sacremoses>=0.0.53",
        "hydra-core>=1.3",
        "matplotlib>=3.5",  # convs2s-plot-attention
        "tensorboardX>=2.0",  # fairseq's --tensorboard-logdir (and its "Please install tensorboardX" at import)
    ],
    extras_require={
        "test": ["pytest>=7"],
        # GPL-3 word aligner, called only as a separate process (`eflomal-align`).
        "align": ["eflomal"],
        # ROUGE for the Gigaword summarization recipe.
        "gigaword": ["rouge-score"],
    },
    entry_points={
        "console_scripts": [
            "convs2s-user-dir = fairseq_convs2s_ext.user_dir:main",
            "convs2s-prepare = preprocess.pipeline:main",
            "convs2s-align-dict = preprocess.align:main",
            "convs2s-postprocess = preprocess.postprocess:main",
            "convs2s-recipe = recipes.run:main",
            "convs2s-import-fconv = fairseq_convs2s_ext.import_fconv:main",
            "convs2s-plot-attention = fairseq_convs2s_ext.cli.plot_attention:main",
            "convs2s-average-checkpoints = fairseq_convs2s_ext.cli.average_checkpoints:main",
        ]
    },
)
