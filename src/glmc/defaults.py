"""Defaults that the command line's help shows, kept torch-free (their users import them here).

``glmc --help`` and every ``glmc COMMAND --help`` build without importing torch; the modules
that act on these values (:mod:`glmc.evaluate`, :mod:`glmc.barrier`) take them from here.
"""

#: Default cap on the tokens evaluated for a language model (the first windows of the split);
#: Tiny Shakespeare's test split (55,770 characters) is evaluated whole.
DEFAULT_TEXT_TOKENS = 65_536
#: Default images per batch for classifiers.
DEFAULT_IMAGE_BATCH = 250
#: Default logits budget per text batch (batch x context x vocab floats).
TEXT_LOGITS_BUDGET = 2**25

#: The largest λ grid a barrier evaluates (each point evaluates the split once).
MAX_POINTS = 1001
#: Fewer evaluated targets (tokens or images) than this make a barrier noise: it is flagged.
MIN_EVAL_TARGETS = 100

#: Corrections of the merged statistics (:mod:`glmc.correction`).
CORRECTIONS: tuple[str, ...] = ("none", "reset", "repair")
