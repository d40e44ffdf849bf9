"""A lockstep member's side of the baton: the workers of one repeat's modes are alive together and take
turns, so the machine's speed, which on a shared VM moves within seconds, is the same for both modes'
steps (measure/conductor.py conducts them; launchers/lockstep.py runs a set from the parent).

The protocol, over two pipes per member (AMP_BENCH_BATON="READ_FD,WRITE_FD"): the conductor first
writes one line, the pids of every member (so a member's contention check counts its partners' CPU
time as its own side's), then one byte, b"g", for each turn it gives. The member answers each turn
with one byte: b"m" (more turns wanted) or b"w" (its measured window is over). Its last turn (the
instrumented steps after every window) ends with its exit, which the conductor reads as end of file.

Torch-free: the step loop calls turn_over() between steps and pass_turn() when it is over.
"""
from __future__ import annotations

import os
import time

BATON_ENV = "AMP_BENCH_BATON"
# A turn ends at the first step boundary after this long: one step of ResNet-50 on a CPU (1-2 s), some
# six of a tiny model (8 ms). Shorter turns cancel faster drift but pay more hand-overs (a pipe write
# and a wake-up each, ~0.1 ms) and wake OpenMP's sleeping threads more often.
TURN_S = 0.05
MORE, WINDOW_OVER, GO = b"m", b"w", b"g"


class NoBaton:
    """The baton of a worker outside a lockstep set: every turn is its own, so a case's code takes and passes
    turns alike whether it runs in a set or alone."""
    partners: tuple[int, ...] = ()
    waited_s = 0.0

    def take(self) -> None:
        pass

    def give(self, word: bytes = MORE) -> None:
        pass

    def turn_over(self) -> bool:
        return False

    def pass_turn(self) -> None:
        pass


class Baton:
    """Held by one member. take() blocks until the conductor gives a turn; give() hands it back."""

    def __init__(self, read_fd: int, write_fd: int, clock=time.monotonic, turn_s: float = TURN_S):
        self.read_fd, self.write_fd, self.clock, self.turn_s = read_fd, write_fd, clock, turn_s
        self.partners: list[int] = []  # the other members' pids (the header line)
        self.waited_s = 0.0  # time spent waiting for turns
        self.held_s = 0.0  # time spent holding the baton (turns given back)
        self._turn_started: float | None = None
        self._header_read = False

    @classmethod
    def from_env(cls) -> Baton | None:
        value = os.environ.get(BATON_ENV, "")
        if not value:
            return None
        read_fd, write_fd = (int(part) for part in value.split(","))
        return cls(read_fd, write_fd)

    def _read_header(self) -> None:
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(self.read_fd, 1)
            if not chunk:
                raise EOFError("the lockstep conductor went away before the first turn")
            line += chunk
        me = os.getpid()
        self.partners = [int(p) for p in line.split() if int(p) != me]
        self._header_read = True

    def take(self) -> None:
        """Wait for a turn (the first call reads the header first)."""
        started = self.clock()
        if not self._header_read:
            self._read_header()
        if os.read(self.read_fd, 1) != GO:
            raise EOFError("the lockstep conductor went away")
        now = self.clock()
        self.waited_s += now - started
        self._turn_started = now

    def give(self, word: bytes = MORE) -> None:
        """End this turn: MORE (another window turn wanted) or WINDOW_OVER."""
        if self._turn_started is not None:
            self.held_s += self.clock() - self._turn_started
            self._turn_started = None
        os.write(self.write_fd, word)

    def holding_s(self) -> float:
        """Time held so far, the current turn included."""
        return self.held_s + (self.clock() - self._turn_started if self._turn_started is not None else 0.0)

    def turn_over(self) -> bool:
        return self._turn_started is not None and self.clock() - self._turn_started >= self.turn_s

    def pass_turn(self) -> None:
        """Between two steps of the window: give the turn back and wait for the next."""
        self.give(MORE)
        self.take()


NO_BATON = NoBaton()
