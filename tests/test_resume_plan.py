"""The resume planner (pure): which cells are replayed and why."""

from __future__ import annotations

from spotbook.attempt.executor import python_transform
from spotbook.attempt.replay import cell_names, plan_resume

SOURCES = [
    "import os\nimport numpy as np",  # 0
    "data = np.arange(10)\nfh = open('f')",  # 1
    "gen = (x for x in data)",  # 2
    "with open('m', 'a') as marker:\n    marker.write('x')\nexpensive = 1",  # 3
    "data[0] = 5\ntotal = sum(data)",  # 4
    "print(next(gen), fh.read(), total)",  # 5
]
EXE = [True] * len(SOURCES)
NOTAGS: list[list[str]] = [[] for _ in SOURCES]


def _plan(snapshot_after: int | None, unrestored: set[str] = frozenset(), tags=NOTAGS, exe=EXE):
    """Plan a resume of SOURCES at cell 5."""
    return plan_resume(
        start=5,
        executable=exe,
        sources=SOURCES,
        tags=tags,
        snapshot_after=snapshot_after,
        unrestored=frozenset(unrestored),
    )


def test_names_bound_and_read() -> None:
    n = cell_names(
        "import a.b as c, d.e\nfrom f import g\nx, y = 1, 2\ndef h(p):\n    q = p\n"
        "class K: pass\nz += w\nfor i in r: pass\nm[0] = 1"
    )
    assert n.binds == {"c", "d", "g", "x", "y", "h", "K", "z", "i"}
    assert {"w", "r", "p", "m"} <= n.reads and "q" not in n.binds


def test_ipython_syntax_is_understood() -> None:
    n = cell_names("%matplotlib inline\nfiles = !ls\nx = 1", python_transform)
    assert {"files", "x"} <= n.binds
    assert cell_names("%%bash\necho hi", python_transform).binds == frozenset()
    assert cell_names("def (:", None).binds == frozenset()  # syntax errors bind nothing


def test_without_a_snapshot_everything_is_replayed() -> None:
    plan = _plan(None)
    assert plan.replay == (0, 1, 2, 3, 4)


def test_only_producers_of_unrestored_variables_a_later_cell_reads() -> None:
    plan = _plan(4, {"fh", "gen", "marker"})
    # 'marker' is a closed file no later cell reads: cell 3 (expensive) is not replayed.
    assert plan.head == (1, 2) and plan.tail == ()
    assert "fh" in plan.reasons[1] and "gen" in plan.reasons[2]
    assert plan.chains == {"fh": (1,), "gen": (2,)} and plan.dropped == ("marker",)


def test_cells_after_the_snapshot_form_the_tail() -> None:
    plan = _plan(2)
    assert plan.head == () and plan.tail == (3, 4)


def test_transitive_producers_and_changers_are_replayed() -> None:
    # gen reads data, which cannot be restored either: data's chain is cell 1, which
    # makes it, and cell 4, which changes it in place
    plan = _plan(4, {"gen", "data"})
    assert plan.head == (1, 2, 4)
    assert plan.chains["data"] == (1, 2, 4) and plan.chains["gen"] == (2,)


def _chain(sources: list[str], unrestored: dict[str, str], **kw):
    n = len(sources)
    return plan_resume(
        start=n - 1,
        executable=[True] * n,
        sources=sources,
        tags=[[] for _ in sources],
        snapshot_after=n - 2,
        unrestored=unrestored,
        **kw,
    )


def test_a_chain_holds_every_cell_that_advanced_a_generator() -> None:
    plan = _chain(
        ["g = (i for i in range(9))", "x = 1", "next(g)", "y = [next(g) for _ in 'ab']", "next(g)"],
        {"g": "generator"},
    )
    assert plan.chains == {"g": (0, 2, 3)} and plan.head == (0, 2, 3)
    assert "generator" in plan.reasons[2] and plan.may_differ == ()


def test_a_value_rebuilt_from_itself_replays_each_step() -> None:
    plan = _chain(
        [
            "import threading\nstate = {'lock': threading.Lock(), 'n': 0}",
            "state = {**state, 'n': state['n'] + 1}",
            "state = {**state, 'n': state['n'] + 1}",
            "print(state['n'])",
        ],
        {"state": "dict"},
    )
    assert plan.chains == {"state": (0, 1, 2)}


def test_what_cannot_be_rebuilt_is_named() -> None:
    plan = _chain(["globals()['g'] = iter(range(3)).__iter__()", "x = 1", "next(g)"], {"g": ""})
    assert "no cell before the snapshot binds it" in plan.unrebuildable["g"]
    tags = [["spotbook-no-replay"], [], []]
    plan = plan_resume(
        start=2,
        executable=[True] * 3,
        sources=["g = iter(x for x in 'ab')", "x = 1", "next(g)"],
        tags=tags,
        snapshot_after=1,
        unrestored={"g": "generator"},
    )
    assert "spotbook-no-replay" in plan.unrebuildable["g"]


def test_what_may_differ_is_said_by_name() -> None:
    sources = ["k = 1\ng = (k * i for i in range(5))", "k = 2", "next(g)"]
    effects = {0: {"writes": ["/w/results.csv"], "random": ["random"]}, 1: {"runs": ["ls"]}}
    plan = _chain(sources, {"g": "generator"}, effects=effects)
    said = " | ".join(plan.may_differ)
    assert "cell 0 draws from a global random generator; writes /w/results.csv" in said
    assert "runs ls" not in said  # cell 1 is not replayed: its effects do not matter
    # with the generators' starting state recorded, the draws are replayed exactly
    plan = _chain(sources, {"g": "generator"}, effects=effects, rng_known=frozenset({0}))
    assert "random" not in " | ".join(plan.may_differ)
    # a chain cell that reads a restored value a later cell changed is named
    sources = ["g = (x for x in range(3))\nprint(n)", "n = 5", "next(g)"]
    plan = _chain(["n = 1", *sources], {"g": "generator"})
    assert any("'n' as it was at the snapshot" in m for m in plan.may_differ)
    # in order (no snapshot): only the world effects count, not the draws
    plan = plan_resume(
        start=2,
        executable=[True] * 3,
        sources=sources,
        tags=[[], [], []],
        snapshot_after=None,
        effects=effects,
    )
    assert plan.may_differ == (
        "cell 0 writes /w/results.csv, and was replayed",
        "cell 1 runs ls, and was replayed",
    )


def test_tags_force_or_forbid_replay() -> None:
    tags = [["spotbook-replay"], ["spotbook-no-replay"], [], [], [], []]
    plan = _plan(4, {"fh"}, tags=tags)
    assert plan.head == (0,)
    plan = _plan(None, tags=tags)
    assert 1 not in plan.replay


def test_non_executable_cells_are_never_replayed() -> None:
    exe = [True, False, True, True, True, True]
    plan = _plan(None, exe=exe)
    assert 1 not in plan.replay


def test_unrestored_global_used_inside_a_restored_function_is_replayed() -> None:
    sources = ["ip = get_ipython()\ndef show(x):\n    ip.display(x)", "y = 1", "show(y)"]
    plan = plan_resume(
        start=2,
        executable=[True] * 3,
        sources=sources,
        tags=[[], [], []],
        snapshot_after=1,
        unrestored=frozenset({"ip"}),
    )
    assert plan.head == (0,)


def test_reads_of_a_plain_variables_cell_are_not_needed_later() -> None:
    sources = ["with open('m') as fh:\n    n = len(fh.read())", "print(n)"]
    plan = plan_resume(
        start=1,
        executable=[True, True],
        sources=sources,
        tags=[[], []],
        snapshot_after=0,
        unrestored=frozenset({"fh"}),
    )
    assert plan.head == ()


def test_files_the_tail_wrote_are_given_back_before_it_replays() -> None:
    plan = plan_resume(
        start=3,
        executable=[True] * 3,
        sources=["x = 1", "open('a.txt', 'a').write('1')", "open('a.txt', 'a').write('2')"],
        tags=[[], [], []],
        snapshot_after=0,
        effects={1: {"writes": ["/w/a.txt"]}, 2: {"writes": ["/w/a.txt"], "runs": ["ls"]}},
        undo={1: {"/w/a.txt": 5}, 2: {"/w/a.txt": 6}},
    )
    assert plan.tail == (1, 2) and plan.give_back == {"/w/a.txt": 5}
    # writing a file it gets back as it was is exact; running a command is not
    assert plan.may_differ == ("cell 2 runs ls, and was replayed",)
