"""kiln: an optimizing compiler for PyTorch models.

    fast = torch.compile(model, backend="kiln")            # just-in-time, through Dynamo
    compiled = kiln.compile(model, (x,), kiln.Options())   # ahead of time, same engine
    print(compiled.report)
"""

from kiln.frontend.export import CompiledModel
from kiln.frontend.export import compile_model as compile  # noqa: A001
from kiln.options import Options

__version__ = "0.1.0"

__all__ = ["CompiledModel", "Options", "compile", "__version__"]
