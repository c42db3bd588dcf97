"""``python tests/train_launches.py LAUNCHES.json RESULTS.json``: launches of ``python -m transformer_nmt.train``
one after another in this one interpreter, so that a test of many launches pays the training imports once.

LAUNCHES.json: a list of argument lists (what would follow ``python -m transformer_nmt.train``). RESULTS.json: per
launch, ``{"returncode", "stdout", "stderr"}`` as the command's process would have given them: the exit status (0;
SystemExit's code, or 1 with its message printed as the interpreter prints it; 1 with the traceback for an exception
that escapes the command) and what was written to sys.stdout and sys.stderr while it ran. Before each launch the
logging module is put back as a fresh interpreter has it (no handler on any logger, every logger enabled, the root at
WARNING), since Hydra configures logging per launch and a job_logging choice that configures nothing (``none``)
would otherwise inherit the previous launch's handlers.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import traceback
from pathlib import Path

from transformer_nmt.train import main as train_command


def fresh_logging() -> None:
    """Logging as a new interpreter has it: every handler closed and removed, every logger enabled at NOTSET."""
    for logger in [logging.root, *(v for v in logging.root.manager.loggerDict.values()
                                   if isinstance(v, logging.Logger))]:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
        logger.disabled, logger.propagate = False, True
        logger.setLevel(logging.NOTSET)
    logging.root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)


def launch(arguments: list[str]) -> dict:
    fresh_logging()
    sys.argv = ["transformer_nmt.train", *arguments]
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            train_command()
        except SystemExit as stop:  # as the interpreter ends: an int is the status, anything else is printed
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if not isinstance(stop.code, (int, type(None))):
                print(stop.code, file=sys.stderr)
        except BaseException:  # the process would have died of it: status 1, the traceback on stderr
            traceback.print_exc()
            code = 1
    fresh_logging()
    return {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> None:
    launches = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps([launch(arguments) for arguments in launches]))


if __name__ == "__main__":
    main()
