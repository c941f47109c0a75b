"""``python -m arbormem.eval locomo FILE...`` / ``python -m arbormem.eval bench``."""

from .cli import main

main(prog_name="python -m arbormem.eval")
