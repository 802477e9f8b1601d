"""Differential tier: jaxrl's objectives against SkyRL's own functions on seeded inputs.

install_env.py  builds (once, cached under ~/.cache/jaxrl/) the separate environment SkyRL's code runs in
skyrl_side.py   runs inside that environment: loads SkyRL's modules and evaluates every case with them
cases.py        the seeded cases (numpy only; shared by both sides through a pickle)
jaxrl_side.py   evaluates the same cases with jaxrl.rl
differences.py  the written list of intentional differences (docs/recipes.md), each with its minimal input
test_skyrl_diff.py  the tests
"""
