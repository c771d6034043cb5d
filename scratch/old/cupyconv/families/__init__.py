"""The kernel families, one module each, named after its file in kernels/ (the house follows the data).

Each module states what it covers and owns everything between a ConvProblem and its launches:

* ``KERNEL``: the family's name (cupyconv.planner.KERNELS), and ``CONFIG_NAMES``: the config names
  that select it in ``make_plan(config=...)`` without a kernel;
* its config dataclass and tile table, and the constants its choices come from;
* ``refusal(problem) -> str``: why it cannot run the problem ("" when it can);
* ``make_plan(problem, config=None, reason="", ...) -> LaunchPlan``: its tile, grid and block, and why;
* ``describe(plan) -> str`` (what ``str(plan)`` prints) and ``name_expression(plan) -> str``;
* ``specialisations() -> list[str]``: every name expression it can launch on any GPU (the compile
  test builds them), and, in a family with kernels for one architecture alone,
  ``arch_specialisations() -> dict[str, list[str]]``;
* ``program(plan, problem) -> cupyconv.program.CallProgram``: its launches as data.

cupyconv.planner ranks the families and dispatches to them; common.py holds what they share.
"""
