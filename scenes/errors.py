"""The one exception a scene raises: every problem of a scene file, reported at once."""
from __future__ import annotations

from particles.errors import ParticlesUserError


class SceneError(ParticlesUserError):
    """A scene that cannot be loaded; ``problems`` lists each problem (a str per problem).

    The message names the scene file and lists every problem, e.g.::

        scene file 'x.toml': 2 problems:
          - [dynamics] beta: expected a number > 0, got -1
          - unknown key 'beeta' in [dynamics]; did you mean 'beta'?
    """

    def __init__(self, source: str, problems, is_file: bool = True):
        self.source = str(source)
        self.problems = [str(p) for p in problems]
        self.is_file = is_file
        what = f"scene file '{_escaped(self.source)}'" if is_file else f"scene '{_escaped(self.source)}'"
        count = len(self.problems)
        head = f"{what}: {count} problem{'s' if count != 1 else ''}:"
        super().__init__("\n  - ".join([head] + [_escaped(p) for p in self.problems]))


def _escaped(text: str) -> str:
    """A path with a newline or another control character shown escaped, so that each problem
    stays on its line."""
    return "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in text)
