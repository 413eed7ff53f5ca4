"""Pure parts of the fault harness: the lazyfs-lite replay (what a power
loss keeps of a data dir), partition shapes, and the seeded schedule. No
broker is started."""

from faults import lazyfs, nemesis

D = "/d"


def test_a_power_loss_keeps_the_synced_prefix_and_the_durable_names_only():
    log = [
        "C 1 /d/a", "S 1 10 /d/a",                        # a: 10 bytes synced, 5 more written
        "C 2 /d/b.tmp", "S 2 3 /d/b.tmp", "C 3 /d/b",
        "R 2 /d/b.tmp /d/b", "K 3 /keep/1 /d/b",            # b replaced by b.tmp ...
        "D /d",                                            # ... durably
        "C 4 /d/c.tmp", "R 4 /d/c.tmp /d/c",                # c: created and renamed, no dir sync
        "C 5 /d/f.tmp", "S 5 3 /d/f.tmp",
        "R 5 /d/f.tmp /d/a", "K 1 /keep/2 /d/a",            # a replaced, not durably
        "S 9",                                             # a torn last line
    ]
    listing = {"/d/a": (5, 3), "/d/b": (2, 3), "/d/c": (4, 1), "/keep/2": (1, 15)}
    p = lazyfs.plan(log, listing)
    assert p.names == [
        ("rename", "/d/a", "/d/f.tmp"),   # the rename over a is undone ...
        ("rename", "/keep/2", "/d/a"),    # ... and the replaced a comes back
        ("unlink", "/d/f.tmp"),           # f.tmp itself was never durable
        ("rename", "/d/c", "/d/c.tmp"),
        ("unlink", "/d/c.tmp"),
    ]
    assert p.truncate == {"/d/a": 10}  # the old a, cut to its synced length
    assert p.bytes_dropped == 5


def test_everything_synced_is_kept():
    log = ["C 1 /d/a", "S 1 4 /d/a", "D /d"]
    p = lazyfs.plan(log, {"/d/a": (1, 4)})
    assert p.names == [] and p.truncate == {}


def test_partition_shapes():
    links, what = nemesis.partition_links([1, 2, 3], "isolate", 0.0)
    assert sorted(links) == [(1, 2), (1, 3)] and what == "isolate 1"
    links, what = nemesis.partition_links([1, 2, 3, 4, 5], "majority", 0.0)
    assert sorted(links) == [(1, 3), (1, 4), (1, 5), (2, 3), (2, 4), (2, 5)]
    links, what = nemesis.partition_links([1, 2, 3, 4, 5], "bridge", 0.0)
    assert sorted(links) == [(2, 4), (2, 5), (3, 4), (3, 5)]  # 1 reaches both halves
    assert what == "bridge 1 between [2, 3] and [4, 5]"


def test_the_schedule_is_a_function_of_the_seed():
    a = nemesis.schedule(7, list(nemesis.KINDS), 50)
    assert a == nemesis.schedule(7, list(nemesis.KINDS), 50)
    assert a != nemesis.schedule(8, list(nemesis.KINDS), 50)
    assert {s.kind for s in nemesis.schedule(7, ["pause"], 20)} == {"pause"}
    assert all(1 <= s.duration <= 40 for s in nemesis.schedule(7, ["pause"], 50))
