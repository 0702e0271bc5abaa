"""The `trainstack` command line.

Exit codes (a contract for CI): 0 success, 1 a user error in config (one clean message,
no traceback), 2 bad command-line usage, 3 mandatory policy violations in a preview.
"""

from __future__ import annotations

import inspect
import shutil
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any

import pulumi
import typer
import yaml
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand, TyperGroup, TyperOption

from trainstack import terminal
from trainstack.config import ConfigError, ConfigIssue
from trainstack.config.errors import did_you_mean
from trainstack.config.lines import with_lines
from trainstack.config.loader import stack_name_from_path
from trainstack.config.model import TeamStackConfig
from trainstack.config.project import Project
from trainstack.diff.cli import register as _register_diff
from trainstack.diff.cli import select_changed as _select_changed
from trainstack.explain.cli import register as _register_explain
from trainstack.jobs.healthcheck import UsageError as HealthcheckUsage
from trainstack.jobs.healthcheck import healthcheck
from trainstack.jobs.platform import PlatformView
from trainstack.jobs.spec import advice, load_job
from trainstack.kube import ApiError, Kube, KubeconfigError
from trainstack.logs import DEFAULT_PREFIX_ROOT, LogsError, LogsUsage
from trainstack.logs import Options as LogsOptions
from trainstack.logs import run as run_logs
from trainstack.preview import policy_config as policy_files
from trainstack.preview.engine import Previewer
from trainstack.preview.plan import Plan, normalise, write_plan
from trainstack.preview.summary import capacity_renderables, jobs_renderables
from trainstack.preview.validate import Validator
from trainstack.report import register as _register_report
from trainstack.sandbox.command import register as _register_sandbox

EXIT_OK = 0
EXIT_USER_ERROR = terminal.EXIT_USER_ERROR
EXIT_USAGE = 2  # click's own code for bad command-line usage
EXIT_POLICY_VIOLATION = 3
EXIT_CODES = (
    f"Exit codes: {EXIT_OK} success; {EXIT_USER_ERROR} a config or input error (each problem "
    f"once, with its file and field, no traceback); {EXIT_USAGE} bad command-line usage (an "
    f"unknown option, a stack name with no stack file); {EXIT_POLICY_VIOLATION} mandatory "
    "policy violations in a preview (the plan is still written)."
)


PROJECT_DIR_HELP = "Folder with Pulumi.yaml, or a folder below it."


def _paragraphs(text: str | None) -> str | None:
    """Docstring paragraphs as paragraphs: rich help keeps a docstring's line breaks."""
    if text is None:
        return None
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def _plain_flags(command: TyperCommand | TyperGroup, ctx: Any) -> None:
    """No type column for flags (typer shows `<bool>` for `--check` and `--help`): a flag takes
    no value."""
    for param in command.get_params(ctx):
        if isinstance(param, TyperOption) and param.is_flag:
            param.metavar = ""


class Command(TyperCommand):
    """Every `trainstack` command: wrapped help paragraphs, flags without a type."""

    def __init__(self, name: str | None, **kwargs: Any) -> None:
        kwargs["help"] = _paragraphs(kwargs.get("help"))
        super().__init__(name, **kwargs)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _plain_flags(self, ctx)
        super().format_help(ctx, formatter)


class Group(TyperGroup):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        _plain_flags(self, ctx)
        super().format_help(ctx, formatter)


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Multi-team GPU training platform: offline previews, validation and plan diffs.",
    epilog=EXIT_CODES,
    cls=Group,
)
console = terminal.out  # verbatim text: see trainstack/terminal.py
errors = terminal.err


def relative(text: str) -> str:
    """Paths in a message as the user can use them from here: the preview named files by
    their absolute path, validate as given (issue 41 #4); both now relative below the working
    directory."""
    return text.replace(f"{Path.cwd().resolve()}/", "")


def described(err: Exception, *bases: Path) -> str:
    """What the user reads for an error: a config error's issues with the line of the file
    they point at (issue 41 #4), paths relative to here."""
    if isinstance(err, ConfigError):  # a YamlSyntaxError renders its own line
        return relative(with_lines(err, *bases, Path.cwd()))
    return relative(str(err))


def _fail(message: str) -> typer.Exit:
    return terminal.fail(relative(message))


def _installed_version() -> str:
    try:
        return version("trainstack")
    except PackageNotFoundError:  # a source tree on sys.path, never installed
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        console.print(f"trainstack {_installed_version()}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    del show_version  # handled by its callback


def shown(path: Path) -> str:
    """A path as the user can use it from here: relative below the working directory,
    absolute elsewhere."""
    absolute = path.resolve()
    try:
        return str(absolute.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(absolute)


def short_type(resource_type: str) -> str:
    """aws:ec2/launchTemplate:LaunchTemplate -> aws:ec2:LaunchTemplate (the module's last part
    repeats the type); kubernetes:core/v1:ConfigMap stays as it is."""
    package, module, kind = [*resource_type.split(":", 2), "", ""][:3]
    base, _, last = module.rpartition("/")
    if base and last.lower() == kind.lower():
        return f"{package}:{base}:{kind}"
    return resource_type


def short_component(ref: str) -> str:
    """trainstack:aws:GpuNodePool::prod-pool-a -> GpuNodePool prod-pool-a"""
    rtype, sep, name = ref.partition("::")
    return f"{rtype.rsplit(':', 1)[-1]} {name}" if sep else ref


def summary_table(plan: Plan, width: int) -> Table:
    """Resources by component and type: one row per type when that fits in `width`; else the
    compact form, each component a heading over its types (short names), for 80 columns."""
    title = f"{plan.kind} stack {plan.stack!r}: resources by component and type"
    counts = plan.counts_by_component()
    wide = Table(title=title)
    wide.add_column("component", overflow="fold")
    wide.add_column("type", overflow="fold")
    wide.add_column("count", justify="right")
    for component, by_type in counts.items():
        for index, (rtype, count) in enumerate(sorted(by_type.items())):
            wide.add_row(Text(component if index == 0 else ""), Text(rtype), str(count))
    natural = Measurement.get(console, console.options.update(max_width=10_000), wide)
    if natural.maximum <= width:
        return wide
    compact = Table(title=title)
    compact.add_column("component / type", overflow="fold")
    compact.add_column("count", justify="right")
    for index, (component, by_type) in enumerate(counts.items()):
        if index:
            compact.add_section()
        compact.add_row(Text(short_component(component), style="bold"), str(sum(by_type.values())))
        for rtype, count in sorted(by_type.items()):
            compact.add_row(Text(f"  {short_type(rtype)}"), str(count))
    return compact


def print_summary(plan: Plan, out_dir: Path, seconds: float) -> None:
    console.print(summary_table(plan, console.width))
    total = sum(sum(by_type.values()) for by_type in plan.counts_by_component().values())
    console.print(
        f"{total} resources, {len(plan.kubernetes_objects())} Kubernetes objects, "
        f"{len(plan.outputs)} outputs -> {shown(out_dir)} ({seconds:.1f}s)",
        soft_wrap=True,
    )
    # Platform stacks: firm vs elastic GPUs and what the queues promise; team stacks: their
    # jobs against the team's limits.
    for renderable in [*capacity_renderables(plan.outputs), *jobs_renderables(plan)]:
        console.print(renderable)


def print_policy_report(plan: Plan) -> None:
    if not plan.violations:
        console.print("policy: no violations")
        return
    table = Table(title=f"policy report for {plan.stack!r}")
    for column in ("rule", "level", "resource", "message and fix"):
        table.add_column(column, overflow="fold")
    for v in plan.violations:
        # A job's finding names its spec file first (issue 41 #4), then the resource.
        resource = f"{v['source']} ({v['resource']})" if v.get("source") else v["resource"]
        table.add_row(Text(v["rule"]), Text(v["level"]), Text(resource), Text(v["message"]))
    console.print(table)


class StackArgumentError(ConfigError):
    """A stack argument that names no stack: bad usage (exit 2), like any other bad argument
    (issue 41 #6: a misspelt stack name exited 1, as a config error)."""


def _usage(err: ConfigError) -> typer.Exit:
    errors.print(Text.assemble(("error: ", "bold red"), relative(str(err))), soft_wrap=True)
    return typer.Exit(EXIT_USAGE)


def stack_names(project: Project, given: list[str]) -> list[str]:
    """Stack names from names or stack file paths (stacks/Pulumi.dev.yaml -> dev), all checked
    at once: one ConfigError with a line per unknown name (and the closest known one)."""
    known = project.stacks()
    folder = project.stacks_dir.resolve()
    names: list[str] = []
    issues: list[ConfigIssue] = []
    for arg in given:
        name = arg
        if "/" in arg or arg.endswith((".yaml", ".yml")):
            path = Path(arg)
            name = stack_name_from_path(path)
            problem = None
            if not name or path.name != f"Pulumi.{name}{path.suffix}":
                problem = "not a stack file: stack files are named Pulumi.<stack>.yaml"
            elif not path.is_file():
                problem = "no such file"
            elif path.resolve().parent != folder:
                problem = (
                    f"not in this project's stack folder ({shown(folder)}); move it there or "
                    "pass --project-dir"
                )
            if problem is not None:
                issues.append(ConfigIssue(arg, problem))
                continue
        if name not in known:
            issues.append(
                ConfigIssue(
                    arg,
                    f"no stack file for {name!r}{did_you_mean(name, known)}; "
                    f"stacks: {', '.join(known) or 'none'}",
                )
            )
            continue
        names.append(name)
    if issues:
        raise StackArgumentError("stack arguments", issues)
    return list(dict.fromkeys(names))


@app.command(cls=Command)
def preview(
    stacks: Annotated[
        list[str] | None,
        typer.Argument(help="Stack names or stack files (dev, stacks/Pulumi.dev.yaml)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Plans go to OUT/<stack>/ (default: build/ in the project folder)."),
    ] = None,
    project_dir: Annotated[Path, typer.Option(help=PROJECT_DIR_HELP)] = Path("."),
    changed_since: Annotated[
        str | None, typer.Option(help="Only stacks the changes since this git ref touch.")
    ] = None,
) -> None:
    """Offline, credential-free plan of STACKS: the real program under Pulumi's mock engine.
    Every name is checked before any stack is previewed."""
    if changed_since is None and not stacks:
        raise typer.BadParameter("name STACKS or pass --changed-since REF", param_hint="STACKS")
    project_root = project_dir.resolve()
    try:
        project = Project.find(project_dir.resolve())
        project_root = project.root
        names = stack_names(project, stacks or [])
        if changed_since is not None:
            names = _select_changed(project_dir, changed_since, names)
        previewer = Previewer(project)
        folder = project.root / "build" if out is None else out
        violating = []
        for stack in names:
            started = time.perf_counter()
            plan = previewer.preview(stack)
            write_plan(plan, folder / stack)
            print_summary(plan, folder / stack, time.perf_counter() - started)
            print_policy_report(plan)
            # The CrossGuard pack's config follows the stack file: the real `pulumi preview
            # --policy-pack` judged by stale settings when nothing regenerated it (issue 41).
            for path in policy_files.write(previewer, [stack]):
                console.print(f"policy pack config: wrote {shown(path)}", soft_wrap=True)
            if plan.mandatory_violations:
                violating.append(stack)
    except StackArgumentError as err:
        raise _usage(err) from None
    except (ConfigError, pulumi.RunError) as err:
        raise _fail(described(err, project_root)) from None
    if violating:
        errors.print(
            Text.assemble(
                ("policy: ", "bold red"), f"mandatory violations in {', '.join(violating)}"
            )
        )
        raise typer.Exit(EXIT_POLICY_VIOLATION)


def print_advice(path: Path, notes: list[str]) -> None:
    """Warnings on stderr, each naming its file, so that stdout stays the result."""
    for note in notes:
        errors.print(Text.assemble((f"{path}: warning: ", "bold yellow"), note), soft_wrap=True)


def expand_files(paths: list[Path]) -> list[Path]:
    """Files as given; a folder stands for its *.yaml files (sorted). ConfigError for a folder
    with none."""
    files: list[Path] = []
    for path in paths:
        if not path.is_dir():
            files.append(path)
            continue
        found = sorted(path.glob("*.yaml"))
        if not found:
            raise ConfigError(
                str(path), [ConfigIssue("folder", "holds no *.yaml file; name the files")]
            )
        files += found
    return list(dict.fromkeys(files))


@app.command(cls=Command)
def validate(
    files: Annotated[
        list[Path],
        typer.Argument(help="Stack files and job specs to check; a folder means its *.yaml."),
    ],
    stack: Annotated[
        str | None,
        typer.Option(
            help="Check job specs against this team stack only (default: every team stack "
            "whose jobs list them)."
        ),
    ] = None,
    project_dir: Annotated[Path, typer.Option(help=PROJECT_DIR_HELP)] = Path("."),
) -> None:
    """The preview's verdict without writing plans: a stack file of the project is previewed
    in full (cross-stack references, its jobs, the policy pack), a job spec is checked
    against the team stacks that list it. Every error once; exit codes as preview's."""
    try:
        paths = expand_files(files)
        try:
            previewer: Previewer | None = Previewer(Project.find(project_dir.resolve()))
        except ConfigError:
            if stack is not None:
                raise
            previewer = None  # no project: schemas and the files' own rules only
        if stack is not None:
            assert previewer is not None
            stack = stack_names(previewer.project, [stack])[0]
    except StackArgumentError as err:
        raise _usage(err) from None
    except ConfigError as err:
        raise _fail(str(err)) from None
    checker = Validator(previewer, stack)
    failed = violating = False
    reported: set[str] = set()
    for path in paths:
        result = checker.file(path)
        for problem in result.errors:
            failed = True
            # A problem outside the file (the --stack, its platform) once, not once per file.
            if str(problem) not in reported:
                reported.add(str(problem))
                root = [previewer.project.root] if previewer is not None else []
                errors.print(described(problem, *root), soft_wrap=True)
        for line in result.violations:
            violating = True
            errors.print(
                Text.assemble((f"{path}: ", "bold red"), f"mandatory {line}"), soft_wrap=True
            )
        if not result.errors and not result.violations:
            console.print(f"{path}: ok ({result.what})", soft_wrap=True)
        print_advice(path, result.notes)
    if failed:
        raise typer.Exit(EXIT_USER_ERROR)
    if violating:
        raise typer.Exit(EXIT_POLICY_VIOLATION)


@app.command("render-job", cls=Command)
def render_job(
    spec: Annotated[Path, typer.Argument(help="A job spec (job_specs/<team>/<job>.yaml).")],
    *,
    stack: Annotated[
        str, typer.Option(help="The team stack the job belongs to (a name or its stack file).")
    ],
    project_dir: Annotated[Path, typer.Option(help=PROJECT_DIR_HELP)] = Path("."),
    submit: Annotated[
        bool,
        typer.Option(
            "--submit",
            help="Create the Job in the cluster of the kubeconfig, as its user (admission "
            "applies), instead of printing it.",
        ),
    ] = False,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="With --submit: the kubeconfig (default as kubectl's).")
    ] = None,
    context: Annotated[str | None, typer.Option(help="With --submit: its context.")] = None,
) -> None:
    """Print the exact Volcano Job the team stack would create, for use with kubectl; with
    --submit, create it."""
    try:
        previewer = Previewer(Project.find(project_dir.resolve()))
        name = stack_names(previewer.project, [stack])[0]
        manifest = previewer.render_job(name, spec)
        print_advice(spec, advice(load_job(spec)))
    except StackArgumentError as err:
        raise _usage(err) from None
    except (ConfigError, pulumi.RunError) as err:
        raise _fail(described(err)) from None
    if not submit:
        typer.echo(yaml.safe_dump(normalise(manifest), sort_keys=False), nl=False)
        return
    meta = manifest["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"
    try:
        Kube.from_kubeconfig(kubeconfig, context).create(manifest)
    except KubeconfigError as err:
        raise _fail(str(err)) from None
    except ApiError as err:  # the API server's answer verbatim: admission names its rule
        raise _fail(f"the cluster refused job {where}: {err.message}") from None
    except OSError as err:
        raise _fail(f"cannot reach the cluster of the kubeconfig: {err}") from None
    console.print(f"created job {where}", soft_wrap=True)


@app.command("healthcheck", cls=Command)
def healthcheck_command(
    pool: Annotated[str, typer.Argument(help="The GPU pool to check.")],
    *,
    stack: Annotated[
        str,
        typer.Option(
            help="A platform stack, or a team stack: the check runs in its team's namespace and "
            "queue (default: the first team, by name, that may use the pool)."
        ),
    ],
    image: Annotated[
        str,
        typer.Option(
            help="An image with the training runtime (trainstack_runtime) and torch, pinned "
            "as the stack's jobs must be."
        ),
    ],
    nodes: Annotated[
        int | None,
        typer.Option(
            min=1, help="Nodes to check, one replica each (default: 2, or 1 on a one-node pool)."
        ),
    ] = None,
    floor: Annotated[
        float | None,
        typer.Option(
            help="GB/s of bus bandwidth below which the check fails (default: the catalog's "
            "intra-node floor for a one-node check, none across nodes)."
        ),
    ] = None,
    submit: Annotated[
        bool, typer.Option("--submit", help="Create the job with `kubectl create -f -`.")
    ] = False,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="kubectl's --kubeconfig for --submit.")
    ] = None,
    project_dir: Annotated[Path, typer.Option(help=PROJECT_DIR_HELP)] = Path("."),
) -> None:
    """Render the Volcano Job that measures NCCL all-reduce bus bandwidth across NODES nodes of
    POOL (a whole node per replica), and print it with the pool's floor; with --submit, create
    it. The job's log ends with the JSON result; it fails below the floor (docs/health.md)."""
    try:
        previewer = Previewer(Project.find(project_dir.resolve()))
        name = stack_names(previewer.project, [stack])[0]
        config, _ = previewer.load(name)
        team = config.team if isinstance(config, TeamStackConfig) else None
        platform = config.platform_stack_name if isinstance(config, TeamStackConfig) else name
        view = PlatformView(previewer.preview(platform).outputs)
        check = healthcheck(view, pool, image=image, nodes=nodes, team=team, floor=floor)
    except (StackArgumentError, HealthcheckUsage) as err:
        raise _usage(err) from None
    except (ConfigError, pulumi.RunError) as err:
        raise _fail(described(err)) from None
    text = yaml.safe_dump(normalise(check.manifest), sort_keys=False)
    intra = "none" if check.catalog_floor_gbps is None else f"{check.catalog_floor_gbps:g} GB/s"
    applied = "none" if check.floor_gbps is None else f"{check.floor_gbps:g} GB/s"
    errors.print(
        f"pool {check.pool}: {check.nodes} x {check.gpus_per_node} GPUs, team {check.team}; "
        f"floor {applied} (catalog intra-node floor: {intra})",
        soft_wrap=True,
    )
    if not submit:
        typer.echo(text, nl=False)
        return
    raise typer.Exit(submit_manifest(text, kubeconfig))


def submit_manifest(text: str, kubeconfig: Path | None) -> int:
    """`kubectl create -f -` (create: a second check of the same pool is refused while the
    first exists, instead of replacing it); kubectl's own exit status."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        errors.print(
            Text.assemble(
                ("error: ", "bold red"),
                "--submit needs kubectl on PATH; without --submit the manifest prints for "
                "`kubectl create -f -`",
            ),
            soft_wrap=True,
        )
        return EXIT_USER_ERROR
    command = [kubectl, "create", "-f", "-"]
    if kubeconfig is not None:
        command += ["--kubeconfig", str(kubeconfig)]
    done = subprocess.run(command, input=text, text=True, check=False)
    return done.returncode


@app.command("logs", cls=Command)
def logs_command(
    job: Annotated[str, typer.Argument(help="The training job's name.")],
    *,
    team: Annotated[str, typer.Option(help="The job's team (its namespace).")],
    bucket: Annotated[str, typer.Option(help="The bucket the node log collector writes to.")],
    prefix_root: Annotated[
        str, typer.Option(help="Key prefix above teams/<team>/<job>/ in the bucket.")
    ] = DEFAULT_PREFIX_ROOT,
    task: Annotated[str | None, typer.Option(help="Only this task (worker, master, ...).")] = None,
    replica: Annotated[
        int | None, typer.Option(min=0, help="Only this replica (0, 1, ...).")
    ] = None,
    attempt: Annotated[
        str,
        typer.Option(
            metavar="N|all",
            help="The job's run (0 first, one more after each restart), or all. Default: the "
            "latest attempt only.",
        ),
    ] = "latest",
    since: Annotated[
        str | None,
        typer.Option(help="Only records since a while ago (10m, 2h, 1d) or an RFC 3339 time."),
    ] = None,
    timestamps: Annotated[
        bool, typer.Option("--timestamps", help="Each line's time (UTC) after its prefix.")
    ] = False,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Then stream the live pods' logs with kubectl (needs a kubeconfig).",
        ),
    ] = False,
    kubeconfig: Annotated[Path | None, typer.Option(help="kubectl's --kubeconfig.")] = None,
    endpoint_url: Annotated[
        str | None, typer.Option(help="An S3-compatible store's URL instead of AWS S3.")
    ] = None,
) -> None:
    """Print JOB's container logs from S3, where the node log collector keeps them after its
    pods are gone: every pod's lines merged in time order, each prefixed with its task, replica
    and attempt. By default only the latest attempt. With --follow, then the live pods' logs
    through `kubectl logs -f` (docs/logs.md)."""
    options = LogsOptions(
        job=job,
        team=team,
        bucket=bucket,
        prefix_root=prefix_root,
        task=task,
        replica=replica,
        attempt=attempt,
        since=since,
        timestamps=timestamps,
        follow=follow,
        kubeconfig=kubeconfig,
        endpoint_url=endpoint_url,
    )
    try:
        status = run_logs(options, typer.echo, lambda text: errors.print(text, soft_wrap=True))
    except LogsUsage as err:
        errors.print(Text.assemble(("error: ", "bold red"), str(err)), soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None
    except LogsError as err:
        raise _fail(str(err)) from None
    raise typer.Exit(status)


@app.command("policy-config", cls=Command)
def policy_config(
    stacks: Annotated[
        list[str] | None,
        typer.Argument(help="Stack names or stack files (default: every stack file)."),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if a file is missing or stale.")
    ] = False,
    project_dir: Annotated[Path, typer.Option(help=PROJECT_DIR_HELP)] = Path("."),
) -> None:
    """Write policies/config/STACK.json, the CrossGuard pack's --policy-pack-config, from the
    stack files (a team stack's from its platform stack)."""
    try:
        previewer = Previewer(Project.find(project_dir.resolve()))
        names = stack_names(previewer.project, stacks) if stacks else previewer.project.stacks()
        if check:
            stale = policy_files.stale(previewer, names)
            orphans = [] if stacks else policy_files.orphans(previewer)
            for stack in stale:
                path = policy_files.config_path(previewer, stack)
                errors.print(f"{shown(path)}: missing or stale", soft_wrap=True)
            for path in orphans:
                errors.print(f"{shown(path)}: no stack file {path.stem!r}", soft_wrap=True)
            if stale or orphans:
                raise _fail("policy pack config out of date; run `make policy-config`")
            console.print(f"policy pack config up to date ({len(names)} stacks)")
            return
        for path in policy_files.write(previewer, names):
            console.print(f"wrote {shown(path)}", soft_wrap=True)
        for path in [] if stacks else policy_files.orphans(previewer):
            path.unlink()
            console.print(f"removed {shown(path)} (no stack file)", soft_wrap=True)
    except StackArgumentError as err:
        raise _usage(err) from None
    except (ConfigError, pulumi.RunError) as err:
        raise _fail(str(err)) from None


_register_diff(app)  # `trainstack diff`, `trainstack changed-stacks` (trainstack/diff/)
_register_sandbox(app)  # `trainstack sandbox up|down|status` (trainstack/sandbox/)
_register_report(app)  # `trainstack report` (trainstack/report.py, docs/reports.md)
_register_explain(app)  # `trainstack explain`, `trainstack status` (trainstack/explain/)
_groups = [g.typer_instance for g in app.registered_groups if g.typer_instance is not None]
for _info in [i for typer_app in (app, *_groups) for i in typer_app.registered_commands]:
    if _info.cls in (None, TyperCommand):  # their help as the other commands'
        _info.cls = Command


def main() -> None:
    app()
