"""The ``kiln`` command line.

    kiln bench --models mlp,resnet18 --quick --peers inductor --json out.json
    kiln explain resnet18 --quick --after fold
    kiln explain gpt2 --quick --kernels
    kiln compile resnet50 -o resnet50.kiln         ahead of time; the report's summary
    kiln run model.onnx --input x=x.npy            outputs' shapes and timing
    kiln optimize model.onnx -o model.opt.onnx     optimized, standard ONNX
    kiln report bert --quick -o report.html        the HTML report
    kiln tune bert --trials 32 --db tuning.sqlite  schedules searched, recorded
    kiln db ls --db tuning.sqlite                 what the tuning database holds
    kiln fuzz --graphs 10000 --jobs 8 --seed 1 --out fuzz-out --json fuzz.json
    kiln rules check --rule conv-bn --time-limit 5
    kiln synth generate --max-ops 3 -o rules.txt
    kiln --version

Exit codes: 0 done; 1 the command could not be done (a missing or corrupt file, a model kiln
cannot take), one line on stderr; 2 a mistake in the command line itself (unknown model, pass,
peer or flag). ``--debug`` shows the traceback behind an error.
"""

from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from collections.abc import Sequence

import kiln
from kiln.cli import bench_cmd, explain_cmd, fuzz_cmd, model_cmds, synth_cmd, tune_cmd
from kiln.cli.bench_cmd import markdown_table
from kiln.cli.errors import USAGE_ERROR, USER_ERROR, UsageError, UserError

__all__ = ["main", "markdown_table", "UsageError", "UserError"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --debug is taken anywhere on the line, before or after the command's name
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and argparse's own errors
        return exit_.code if isinstance(exit_.code, int) else USAGE_ERROR
    # torch's pytree warns about its own deprecated LeafSpec inside torch.export; not ours to fix
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    args.debug = debug
    try:
        return args.run(args)
    except UsageError as err:
        return _fail(args, err, USAGE_ERROR)
    except UserError as err:
        return _fail(args, err, USER_ERROR)
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        return 130  # the shell's code for SIGINT
    except Exception as err:  # noqa: BLE001 - kiln's own failure: one line, and how to see more
        if args.debug:
            raise
        print(f"kiln: internal error: {type(err).__name__}: {_first_line(err)} (run again with "
              "--debug for the traceback, and please report it)", file=sys.stderr)
        return USER_ERROR


def _fail(args: argparse.Namespace, err: Exception, code: int) -> int:
    if args.debug:
        traceback.print_exception(err)
    print(f"kiln: error: {_first_line(err)}", file=sys.stderr)
    return code


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kiln", description=kiln.__doc__.splitlines()[0],
        epilog="example: kiln bench --models resnet50 --peers inductor,ort; "
               "`kiln COMMAND --help` for each command")
    parser.add_argument("--version", action="version", version=f"kiln {kiln.__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, print the traceback too")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    for module in (bench_cmd, explain_cmd, model_cmds, tune_cmd, fuzz_cmd):
        module.add_command(commands)
    synth_cmd.add_commands(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
