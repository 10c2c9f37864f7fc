"""ConvS2S (Gehring et al., 2017) as a fairseq plugin: `--user-dir "$(convs2s-user-dir)" --task convs2s_translation`."""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
# The README is the package's long description (an sdist carries it, as it carries LICENSE).
# A tree copied without it builds with the one-line description alone.
README = HERE / "README.md"
# This project has no public home yet: the package names none, and neither does the
# documentation site (mkdocs.yml has no repo_url). Its URLs are the paper's and fairseq's.
PROJECT_URLS = {
    "Paper": "https://arxiv.org/abs/1705.03122",
    "fairseq": "https://github.com/facebookresearch/fairseq",
}

setup(
    name="fairseq-convs2s-ext",
    version="0.1.0",
    description="Convolutional Sequence to Sequence Learning (Gehring et al., 2017) for fairseq",
    long_description=README.read_text(encoding="utf-8") if README.exists() else None,
    long_description_content_type="text/markdown",
    author="the fairseq ConvS2S plugin authors",
    license_expression="MIT",  # SPDX (PEP 639); the text is LICENSE
    license_files=["LICENSE"],
    project_urls=PROJECT_URLS,
    keywords=["fairseq", "convs2s", "machine translation", "sequence to sequence", "convolutional"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Environment :: Console",
        "Environment :: GPU :: NVIDIA CUDA",
        "Intended Audience :: Science/Research",
        "Intended Audience :: Developers",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: Text Processing :: Linguistic",
    ],
    python_requires=">=3.9",
    # The repository's folders preprocess/, recipes/ and serving/ install under names of their
    # own: a top-level "preprocess", "recipes" or "serving" would collide with any other package so named.
    packages=find_packages(include=["fairseq_convs2s_ext", "fairseq_convs2s_ext.*"])
    + ["convs2s_preprocess", "convs2s_recipes", "convs2s_serving"]
    + [f"convs2s_preprocess.{part}" for part in find_packages("preprocess")],
    package_dir={"convs2s_preprocess": "preprocess", "convs2s_recipes": "recipes", "convs2s_serving": "serving"},
    package_data={"convs2s_recipes": ["configs/*.yaml", "configs/recipe/*.yaml"],
                  # the CPU kernels, compiled on first use (serving/kernels.py)
                  "convs2s_serving": ["*.cpp"]},
    include_package_data=True,
    install_requires=[
        # Official fairseq 0.12.2 does not import on Python 3.11; fairseq-fixed is
        # the same code with that fixed (and pins hydra-core 1.3.2, omegaconf 2.3.0).
        "fairseq-fixed==0.12.3.1",
        # 2.6: torch.load's weights_only default, on which the plugin's checkpoint safety
        # rests (checkpoints/safe_loading.py); before it fairseq unpickles anything.
        "torch>=2.6",
        "sacrebleu>=2.0",
        "subword-nmt>=0.3.8",
        "sacremoses>=0.0.53",
        "hydra-core>=1.3",
        "numpy",
        "matplotlib>=3.5",  # convs2s-plot-attention
        "scikit-learn",  # k-means of the output layer's rows (--vocab-rest-clusters); fairseq needs it too
        "tensorboardX>=2.0",  # fairseq's --tensorboard-logdir (and its "Please install tensorboardX" at import)
        "ninja",  # torch.utils.cpp_extension's build of the lean beam step's kernel
    ],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6"],
        # GPL-3 word aligner (convs2s-align-dict --aligner eflomal), called only as a
        # separate process (`eflomal-align`).
        "align": ["eflomal"],
        # ROUGE for the Gigaword summarization recipe.
        "gigaword": ["rouge-score"],
        # The serving benchmark's peer (python -m bench.serving): CTranslate2 and its fairseq converter.
        "bench": ["ctranslate2>=4.8.5"],
        # The documentation site (make docs; tests/test_docs.py builds it with --strict).
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9", "mkdocstrings[python]>=0.25"],
    },
    entry_points={
        "console_scripts": [
            "convs2s-user-dir = convs2s_recipes.user_dir:main",
            "convs2s-prepare = convs2s_preprocess.pipeline:main",
            "convs2s-align-dict = convs2s_preprocess.stages.align:main",
            "convs2s-postprocess = convs2s_preprocess.stages.postprocess:main",
            "convs2s-recipe = convs2s_recipes.run:main",
            "convs2s-data = convs2s_recipes.data:main",
            "convs2s-import-fconv = fairseq_convs2s_ext.cli.import_fconv:main",
            "convs2s-plot-attention = fairseq_convs2s_ext.cli.plot_attention:main",
            "convs2s-translate = fairseq_convs2s_ext.cli.translate:main",
            "convs2s-export = fairseq_convs2s_ext.cli.export:main",
            "convs2s-serve = convs2s_serving.cli:main",
            "convs2s-average-checkpoints = fairseq_convs2s_ext.cli.average_checkpoints:main",
            "convs2s-score = convs2s_recipes.score:main",
        ]
    },
)
