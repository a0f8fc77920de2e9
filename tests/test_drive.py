"""The drive loop (particles.drive): triggers, what writers see, and that where the loop stops
never changes a number."""
import numpy as np
import pytest

from conftest import random_tokens
from particles import Simulation
from particles.drive import AT_END, NEVER, At, Every, Rows, State, Writer, drive


def make_sim(dtype="float64", R=None):
    x = random_tokens(12, 4, seed=3)
    if R:
        x = np.stack([random_tokens(12, 4, seed=3 + r) for r in range(R)])
    heads = [np.eye(4), 0.5 * np.eye(4)]
    return Simulation(x, heads, beta=1.5, rule="softmax", dt=0.05, dtype=dtype)


def test_triggers():
    assert [s for s in range(11) if Every(3).hits(s, 10)] == [0, 3, 6, 9]
    assert Every(3).next_after(9, 10) > 10 and Every(3).next_after(4, 10) == 6
    assert not any(Every(0).hits(s, 10) for s in range(11))
    assert At([2, 7]).next_after(2, 10) == 7 and At([2, 7]).next_after(7, 10) > 10
    assert AT_END.hits(10, 10) and not AT_END.hits(9, 10) and AT_END.next_after(3, 10) == 10
    both = Every(4) | At([5]) | AT_END
    assert [s for s in range(11) if both.hits(s, 10)] == [0, 4, 5, 8, 10]
    assert sorted(both.every_periods()) == [4]
    assert not NEVER.hits(0, 0)


class Spy(Writer):
    def __init__(self, trigger, needs=(), observe=NEVER):
        self.trigger, self.needs, self.observe = trigger, frozenset(needs), observe
        self.states: list[State] = []
        self.rows: list[dict] = []

    def on_state(self, state):
        self.states.append(state)

    def on_rows(self, rows):
        self.rows.extend(rows)


def test_writers_see_exactly_their_states_and_rows():
    sim = make_sim()
    tok = Spy(Every(4) | AT_END, needs={"tokens"})
    obs = Spy(NEVER, observe=At([0, 3, 10]))
    log = Spy(NEVER, observe=Every(5))
    drive(sim, [tok, obs, log], 10)
    assert sim.step_count == 10
    assert [s.step for s in tok.states] == [0, 4, 8, 10]
    assert all(s.tokens.shape == (1, 12, 4) for s in tok.states)
    assert [r["step"] for r in obs.rows] == [0, 3, 10]
    assert [r["step"] for r in log.rows] == [0, 5, 10]


def test_where_the_loop_stops_changes_no_number():
    """Tokens and rows from a drive with many stops equal a plain advance, bitwise."""
    plain = make_sim("float32", R=2)
    plain.advance(30, observe_every=5)
    plain.observe()
    want_rows = plain.take_rows()
    busy = make_sim("float32", R=2)
    spies = [Spy(Every(3), needs={"tokens", "per_token"}), Spy(At([7, 11, 29]), needs={"tokens"})]
    rows = Rows(Every(5) | AT_END)
    drive(busy, spies + [rows], 30, check_every=4, max_chunk=2)
    assert np.array_equal(busy.native_tokens(), plain.native_tokens())
    assert rows.rows == want_rows
    # a state seen by a writer is the state a plain run passes through
    again = make_sim("float32", R=2)
    again.advance(7)
    seen = {s.step: s.tokens for s in spies[1].states}
    assert np.array_equal(seen[7], again.native_tokens())


def test_flush_first_writers_come_before_rows_of_their_state():
    sim = make_sim()
    order = []

    class Saver(Writer):
        flush_first = True
        trigger = Every(4)

        def on_state(self, state):
            order.append(("save", state.step))

    class Log(Writer):
        observe = Every(2)

        def on_rows(self, rows):
            order.extend(("row", r["step"]) for r in rows)

    drive(sim, [Saver(), Log()], 8)
    assert order.index(("save", 4)) > order.index(("row", 2))
    assert order.index(("save", 4)) < order.index(("row", 4))


def test_a_blow_up_stops_the_loop_at_a_check():
    from particles import BlowUpError
    sim = Simulation(random_tokens(8, 3), [40.0 * np.eye(3)], beta=30.0, rule="exp", dt=5.0,
                     dtype="float32", geometry="flat")
    with pytest.raises(BlowUpError):
        drive(sim, [Rows(Every(1))], 200, check_every=5)
    assert sim.step_count % 5 == 0 and sim.step_count < 200


@pytest.mark.parametrize("every", [1, 2, 3])
def test_rows_are_handed_out_while_the_loop_runs_at_every_cadence(every):
    """A stop at every step (a writer wanting tokens at each state) once held every row
    until the end: the fused step from a stop skipped the timed drain (issue 27)."""
    from particles.drive import Driver
    sim = make_sim()
    log = Spy(NEVER, observe=Every(every))
    seen = []

    class Watch(Spy):
        def on_state(self, state):
            seen.append((state.step, len(log.rows)))

    watch = Watch(Every(every), needs={"tokens"})
    Driver(sim, [watch, log], 20, flush_seconds=0.0).run()
    assert [r["step"] for r in log.rows] == list(range(0, 21, every))
    # by state s, every row observed before it has reached the log
    for step, rows in seen:
        if step > every:
            assert rows >= step // every - 1, (step, rows)
