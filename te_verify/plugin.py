"""The pytest plugin: options, case parametrization, expectations, report header, results rows.

Case files declare FAMILY, LANE ("torch", "te" or "dist") and SPECS(tier); a test that takes the `case`
fixture is parametrized over SPECS(tier) x the lane's backends, with ids "<backend>-<spec.id>".
Rows travel as report.user_properties, which xdist ships to the controller (te_verify.run_report), so none are lost.
A report folder is locked by its live run (te_verify.report.lock) from configure on.
"""
from __future__ import annotations

import datetime
import json
import sys
import uuid
from pathlib import Path

import pytest

from te_verify import compat, environment, tmpdirs
from te_verify.run import process_state, worker_threads
from te_verify.te import api as te_api, compile_path
from te_verify import device as run_device
from te_verify.checks.leftovers import process_left_by_test
from te_verify.checks.verdict import CheckFailures
from te_verify.expectations.entries import (ExpectationsError, covering, current_env, load_expectations, mark_reason,
                                            skip_entry)
from te_verify.expectations.judge import Judgement, check_results, judge
from te_verify.backends.registry import BackendError, DIST_WRAPPERS, TIER_DEFAULTS, lane_of, resolve_backend
from te_verify.run.caserun import CaseRun
from te_verify.compat import thunder_named_tensors
from te_verify.compat.versions import unmeasured
from te_verify.distributed.declare import declared_wrapper
from te_verify.matrix.tiers import TierError, check_tier
from te_verify.report.repro import repro_hint
from te_verify.report.lock import ReportLock, ReportLockError, acquire
from te_verify.report.results import outcome_of, reason_of
from te_verify.report.stream import RowStream
from te_verify.report.resume import ResumeError, done_nodeids, load_previous
from te_verify.distributed.engines import engine
from te_verify.distributed.wrappers import wrapper_unavailable
from te_verify.matrix.capability_pass import capability_pass, capability_suffix, drawing_pass
from te_verify.matrix.selection import select_pr
from te_verify.passes import COMPILE_BACKENDS
from te_verify.matrix.shard import ShardError, selected_shard

ROW_KEY = "te_verify_row"
ROOT = Path(__file__).resolve().parents[1]
GAPS = pytest.StashKey[list]()  # the expectation entries covering an item (one skip entry, or xfail entries)
DRAWN_GAPS = pytest.StashKey[dict]()  # expectation key -> its row, for gaps met by specs a test drew


# Fixtures and options of the lanes, --shard, --case-order and --case-timeout; the controller's rows and report.
LANE_PLUGINS = ("te_verify.distributed.pool.fixtures", "te_verify.probes.options", "te_verify.matrix.shard",
                "te_verify.matrix.case_order", "te_verify.case_timeout", "te_verify.run_report")


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    for name in LANE_PLUGINS:
        pluginmanager.import_plugin(name)
    group = parser.getgroup("te_verify")
    group.addoption("--tier", default="pr", help="case tier: smoke, pr or nightly (default pr)")
    group.addoption("--backend", action="append", default=[], metavar="NAME|pkg.mod:attr",
                    help="backend to certify (repeatable): a built-in name or package.module:attr")
    group.addoption("--report-dir", default=None, help="write results.json, summary.md and report.html here")
    group.addoption("--max-examples", type=int, default=25, help="hypothesis examples per generated test")
    group.addoption("--te-impl", default=None,
                    help="TE implementation: transformer_engine (CUDA), transformer_engine_cpu (TE's Python over the "
                         "tex emulation; default without CUDA), reference or package.module")
    group.addoption("--device", default=None,
                    help="device of every tensor the cases make: cpu, cuda (each xdist worker its own GPU) or cuda:N "
                         "(default: cuda when available, else cpu)")
    group.addoption("--te-capability", default="sm90",
                    help="compute capability the tex emulation reports (sm89, sm90, sm100; default sm90)")
    group.addoption("--capability-cases", action="store_true",
                    help="on an emulated device, collect only the TE cases that run at --te-capability "
                         "(te_verify.matrix.capability; te-verify run's capability passes set it)")
    group.addoption("--pass-name", default=None,
                    help="the header's name for this run as one pass of te-verify run's main job (set by it)")
    group.addoption("--expectations", default=str(ROOT / "expectations"),
                    help="folder of <backend>.toml known-gap files (default: the checkout's expectations/)")
    group.addoption("--pr-candidates", action="store_true",
                    help="run every pr-tier candidate instead of the chosen pr tier (te_verify.matrix.selection)")
    group.addoption("--resume", default=None, metavar="DIR",
                    help="finish the killed run whose report folder is DIR: run only its selected cases without a row")


class Session:
    """Per-process state: selected backends, collected rows (controller), run header."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.tier = config.getoption("tier")
        self.rows: list[dict] = []
        self.compat: set[str] = set()
        self.shard = selected_shard(config)
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.run_id = self.started.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]
        self.te_impl = _activate_te_impl(config.getoption("te_impl"), config.getoption("te_capability"))
        names = config.getoption("backend") or list(TIER_DEFAULTS[self.tier])
        # Users' wrappers declared by package.module:attr (te_verify.distributed.declare), by their names.
        self.declared = {d.name: d for d in map(declared_wrapper, names) if d is not None}
        declared_paths = {d.path for d in self.declared.values()}
        self.dist_wrappers = [name for name in names if name in DIST_WRAPPERS] + list(self.declared)
        self.backends = {name: resolve_backend(name) for name in names
                         if name not in DIST_WRAPPERS and name not in declared_paths}
        self.expectations = load_expectations(Path(config.getoption("expectations")))
        self.env = current_env()
        self.report_dir = config.getoption("report_dir") or config.getoption("resume")
        self.stream: RowStream | None = None  # the controller's rows.jsonl, open from session start
        self.selection: list[str] | None = None  # the nodeids this run (a resumed run: its first run) selected
        self.incomplete: dict | None = None  # set at the end where selected cases have no row
        # A --resume's earlier run (its stream) and the cases it finished: they are not run again.
        worker = getattr(config, "workerinput", None)
        # The controller locks the report folder before reading or writing anything in it.
        self.lock: ReportLock | None = None if worker is not None or not self.report_dir else acquire(
            Path(self.report_dir), self.run_id, "--resume" if config.getoption("resume") else "--report-dir")
        resume = config.getoption("resume") if worker is None else None  # workers get the done cases from it
        try:
            self.previous = load_previous(resume, self.header()) if resume else None
        except ResumeError:
            self.release()
            raise
        if self.previous is not None:
            self.selection = self.previous["selection"]
        self.done = set(worker.get("te_verify_done", ())) if worker else set(
            done_nodeids(self.previous) if self.previous else ())

    def release(self) -> None:
        """Free the report folder for the next run."""
        if self.lock is not None:
            self.lock.release()

    def lane_backends(self, lane: str) -> list[tuple[str, object]]:
        return [(b.name, b) for n, b in self.backends.items() if lane_of(n, b) == lane]

    def header(self) -> dict:
        return {
            "run_id": self.run_id,
            "started": self.started.isoformat(),
            "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "tier": self.tier,
            "argv": list(self.config.invocation_params.args),
            "versions": environment.versions(),
            "device": environment.device(),
            "devices": sorted({row["device"] for row in self.rows if row.get("device")}),  # one GPU per worker
            "shard": str(self.shard) if self.shard else None,
            "pass": self.config.getoption("pass_name"),
            "te_capability": te_api.capability(),
            "te_impl": {"name": self.te_impl.name, "why": self.te_impl.why, "ran": self.te_impl.describe},
            "te_compile": compile_path.support_line(),
            "compat": sorted(self.compat | set(compat.APPLIED)),
            "unmeasured_versions": unmeasured(),  # releases outside the ranges measured here (docs/versions.md)
            "backends": {b.name: _availability(b) for b in self.backends.values()},
            "dist_wrappers": list(self.dist_wrappers),
            "backend_paths": {**{b.name: n for n, b in self.backends.items()},
                              **{d.name: d.path for d in self.declared.values()}},
        }


SESSION = pytest.StashKey[Session]()


def _availability(backend) -> str:
    ok, reason = backend.available()
    return "available" if ok else f"unavailable: {reason}"


def _activate_te_impl(choice: str | None, capability: str):
    """Resolve and activate --te-impl before any backend or thunder import (checked cheaply; TE loads on use)."""
    impl = te_api.resolve(choice, capability)
    te_api.activate(impl, capability)
    return impl


def pytest_configure(config: pytest.Config) -> None:
    thunder_named_tensors.apply()  # before anything can import thunder, in every process
    try:
        check_tier(config.getoption("tier"))
        # Before anything initialises CUDA (TE's import does): xdist worker k binds GPU k mod n.
        worker = getattr(config, "workerinput", {}).get("workerid")
        run_device.use(run_device.resolve(config.getoption("device"), worker))
        worker_threads.share_cores(worker is not None)
        config.stash[SESSION] = Session(config)
    except (TierError, BackendError, ExpectationsError, ShardError, ResumeError, ReportLockError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None
    if not hasattr(config, "workerinput"):
        check_selection_expressions(config)
        tmpdirs.remove_stale()  # what killed runs left in /tmp (their rank pools) goes at the next run's start


def check_selection_expressions(config: pytest.Config) -> None:
    """-k and -m parsed before xdist starts workers: a bad one is pytest's one-line usage error there, but workers
    that each refuse it leave xdist's controller with an INTERNALERROR traceback (pytest-xdist's dsession)."""
    from _pytest.mark.expression import Expression

    for flag, text in (("-k", config.option.keyword), ("-m", config.option.markexpr)):
        try:
            Expression.compile((text or "").lstrip())
        except SyntaxError as exc:
            raise pytest.UsageError(f"{flag} {text!r}: at column {exc.offset}: {exc.msg} (an expression of words "
                                    "joined by and, or, not and parentheses)") from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash[SESSION]
    versions = environment.versions()
    return [
        f"te_verify: tier {session.tier}; backends {', '.join([*session.backends, *session.dist_wrappers])}",
        "te_verify versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"te_verify device: {environment.device()}" + (f"; shard {session.shard}" if session.shard else ""),
        f"te_verify TE implementation: {session.te_impl.name}: {session.te_impl.describe} ({session.te_impl.why})",
        "te_verify compatibility steps: " + ("; ".join(compat.APPLIED) or "none"),
        f"te_verify TE torch.compile: {compile_path.support_line()}",
        f"te_verify intra-op threads: {worker_threads.describe(_workers(config))}",
    ]


def _workers(config: pytest.Config) -> int:
    """xdist's worker count for this run (0: no workers, the tests run in this process)."""
    count = getattr(config.option, "numprocesses", None) or 0
    return count if isinstance(count, int) else 0


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    session = metafunc.config.stash[SESSION]
    if "lane_backend" in metafunc.fixturenames:  # a test over the lane's backends, drawing its own specs
        pairs = drawing_pass(metafunc.config, session.lane_backends(metafunc.module.LANE))
        metafunc.parametrize("lane_backend", pairs, ids=[name for name, _ in pairs])
    if "case" not in metafunc.fixturenames:
        return
    module = metafunc.module
    specs = module.SPECS(session.tier)
    if module.LANE == "dist":
        groups = {w: (None, [s for s in specs if s.dist.wrapper == w]) for w in session.dist_wrappers}
        groups.update({name: (None, d.specs(module.FAMILY, specs)) for name, d in session.declared.items()})
    else:
        groups = {name: (backend, specs) for name, backend in session.lane_backends(module.LANE)}
    runs = []
    for name, (backend, group) in groups.items():
        selection = None
        if session.tier == "pr" and not metafunc.config.getoption("pr_candidates") and group:
            if name in COMPILE_BACKENDS:  # the pr tier's share of a compile backend: where TE's code compiles
                group = [spec for spec in group if compile_path.compiles_somewhere(spec)]
            group, selection = select_pr(module.FAMILY, name, group)  # pairwise cover, weighted by cost
        runs += [CaseRun(spec, name, backend, selection) for spec in group]
    # indirect: the `case` fixture below skips a backend that is unavailable here, with its reason
    runs = capability_pass(metafunc.config, module.LANE, runs)  # after the pr selection, which stays the tier's
    suffix = capability_suffix(module.LANE)
    metafunc.parametrize("case", runs, ids=[f"{r.backend_name}-{r.spec.id}{suffix}" for r in runs], indirect=True)


@pytest.fixture
def case(request: pytest.FixtureRequest) -> CaseRun:
    run: CaseRun = request.param
    if run.backend is not None:
        ok, reason = run.backend.available()
        if not ok:
            pytest.skip(f"backend {run.backend_name} unavailable: {reason}")
    trainer = engine(run.backend_name) if run.backend is None else None
    missing = trainer.unavailable() if trainer is not None else None
    if missing:
        pytest.skip(f"engine {run.backend_name} unavailable: {missing}")
    missing = wrapper_unavailable(run.backend_name) if run.backend is None else None
    if missing:
        pytest.skip(f"wrapper {run.backend_name} unavailable: {missing}")
    return run


def _without_backend(item: pytest.Item) -> bool:
    """An item of a lane none of whose backends was selected (pytest's empty parameter set)."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec else {}
    return any(name in params and not isinstance(params[name], kind)
               for name, kind in (("case", CaseRun), ("lane_backend", tuple)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A lane with no selected backend collects nothing; known gaps become strict xfails (or skips) here,
    before anything runs."""
    session = config.stash[SESSION]
    empty = [item for item in items if _without_backend(item) or item.nodeid in session.done]  # done: --resume
    if empty:
        items[:] = [item for item in items if not (_without_backend(item) or item.nodeid in session.done)]
        config.hook.pytest_deselected(items=empty)
    nodeid_entries = [e for e in session.expectations if e.nodeid is not None]
    for item in items:
        run = _case_of(item)
        backend = run.backend_name if run else _drawn_backend(item)
        if run:
            entries = covering(session.expectations, backend, run.spec.id, item.nodeid, session.env, run.spec.family)
        else:  # a test drawing its own specs: only nodeid entries name it (glob entries cover its drawn specs)
            entries = covering(nodeid_entries, backend, item.name, item.nodeid, session.env)
        skip = skip_entry(entries)
        if skip is not None:
            item.add_marker(pytest.mark.skip(reason=mark_reason(skip)))
            entries = [skip]
        if entries:
            item.stash[GAPS] = entries


def _case_of(item: pytest.Item) -> CaseRun | None:
    callspec = getattr(item, "callspec", None)
    run = callspec.params.get("case") if callspec else None
    return run if isinstance(run, CaseRun) else None  # a lane with no selected backend parametrizes NOTSET


def known_gap(request: pytest.FixtureRequest, backend: str, spec, failure: BaseException) -> bool:
    """For a test that draws its own specs: is this drawn spec's failure exactly recorded gaps, judged check by
    check as a collected case is? Such entries are not strict (a drawn spec they cover may pass); what matched is
    noted on the test's row (`drawn_gaps`)."""
    session = request.config.stash[SESSION]
    entries = [e for e in covering(session.expectations, backend, spec.id, "", session.env, spec.family)
               if e.status == "xfail"]
    if not entries or not isinstance(failure, CheckFailures):
        return False
    results = check_results(failure.verdicts)
    # An entry none of whose checks failed on this draw is not this failure's gap: a drawn spec may sit under a pattern
    # without meeting it (a width of 1 that inductor keeps a GEMM), and it must not make the other gaps strict.
    entries = [e for e in entries if any(c in results and not results[c].ok for c in e.checks)]
    if not entries or judge(entries, results).outcome != "xfailed":
        return False
    for entry in entries:
        request.node.stash.setdefault(DRAWN_GAPS, {})[entry.key] = {**entry.to_row(), "case_id": spec.id}
    return True


def _drawn_backend(item: pytest.Item) -> str:
    """The backend of a test that draws its own specs (parametrized over `lane_backend`), else "-"."""
    callspec = getattr(item, "callspec", None)
    pair = callspec.params.get("lane_backend") if callspec else None
    return pair[0] if isinstance(pair, tuple) else "-"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """The last line of defence: whatever the test's body left in the process state (outside the runs the runner
    watched) is restored, so the next test is judged as if run alone, and fails the test naming it, beside the
    test's own verdicts (a known gap that also leaks fails beside it)."""
    before = process_state.snapshot()
    try:
        return (yield)
    finally:
        found = process_state.restore(before)
        failure = sys.exc_info()[1]
        if found.messages and not isinstance(failure, KeyboardInterrupt):
            raise _with_leftovers(item, found, failure) from failure


def _with_leftovers(item: pytest.Item, found: process_state.Leftovers, failure: BaseException | None) -> CheckFailures:
    """The test's verdicts (those it raised, or its case's where it passed) and a failed process_state."""
    run = _case_of(item)
    where = f"[{run.spec.id}] backend {run.backend_name}" if run else f"[{item.nodeid}]"
    verdicts = (failure.verdicts if isinstance(failure, CheckFailures) else
                run.verdicts if failure is None and run is not None else [])
    return CheckFailures([*verdicts, process_left_by_test(where, found.messages, found.compared)])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not (report.when == "call" or (report.when == "setup" and not report.passed)):
        return
    run = _case_of(item)
    row = {**row_of(item), "outcome": outcome_of(report), "reason": reason_of(report),
           "duration": round(report.duration, 4)}
    entries = item.stash.get(GAPS, [])
    judgement = _judge_call(entries, run, report, call)
    if judgement is not None:
        row["checks"] = judgement.checks
        row["outcome"], row["reason"] = outcome_of(report), reason_of(report)
        if judgement.outcome == "xfailed" and call.excinfo is not None:  # what the known gap looked like this time
            row["observed"] = str(call.excinfo.value)[:2000]
        if judgement.outcome == "xpassed":
            row["outcome"], row["reason"] = "xpassed", judgement.message
    if report.failed and row["outcome"] != "xpassed":
        _add_repro_hint(item.config, report, row)
    report.user_properties.append((ROW_KEY, json.dumps(row, default=str)))


def row_of(item: pytest.Item) -> dict:
    """What a case's row says about the case, whatever its outcome (the caller adds outcome, reason, duration)."""
    run = _case_of(item)
    module = getattr(item, "module", None)
    row = {
        "nodeid": item.nodeid,
        "case_id": run.spec.id if run else item.name,
        "family": run.spec.family if run else getattr(module, "FAMILY", item.module.__name__ if module else "?"),
        "backend": run.backend_name if run else _drawn_backend(item),
        "figures": dict(run.figures) if run else {},
        "spec": run.spec.to_dict() if run else None,
        "expectation": None,
        "compat": list(compat.APPLIED),
        "device": str(run_device.active()),
    }
    if module is not None and getattr(module, "LANE", None) == "te":
        row["te_capability"] = te_api.capability()
    if run is not None and run.selection is not None:
        row["selection"] = run.selection
    if item.stash.get(DRAWN_GAPS, None):
        row["drawn_gaps"] = list(item.stash[DRAWN_GAPS].values())
    entries = item.stash.get(GAPS, [])
    if entries:
        row["expectation"], row["gaps"] = entries[0].to_row(), [e.to_row() for e in entries]
    return row


def _judge_call(entries: list, run: CaseRun | None, report: pytest.TestReport, call: pytest.CallInfo) -> Judgement | None:
    """Judge a case's call phase check by check (te_verify.expectations.judge) and set the report's outcome to match:
    xfailed when exactly its known gaps failed as described, failed when anything else failed or a covered check
    passed. None for a phase or a test that ran no check (a skip, a harness error, a test without a case)."""
    if report.when != "call" or report.skipped or any(e.status == "skip" for e in entries):
        return None
    failure = call.excinfo.value if call.excinfo is not None else None
    if isinstance(failure, CheckFailures):
        verdicts = failure.verdicts
    elif failure is None and (run is not None or entries):  # passed: every check it ran (an entry's absent one fails)
        verdicts = run.verdicts if run is not None else []
    else:
        return None
    judgement = judge([e for e in entries if e.status == "xfail"], check_results(verdicts))
    if judgement.outcome == "xfailed":
        report.outcome, report.wasxfail = "skipped", judgement.message
    elif judgement.outcome in ("failed", "xpassed") and entries:
        report.outcome, report.longrepr = "failed", judgement.message
    return judgement


def _add_repro_hint(config: pytest.Config, report: pytest.TestReport, row: dict) -> None:
    session, report_dir = config.stash[SESSION], config.getoption("report_dir")
    paths = {b.name: n for n, b in session.backends.items()}
    hint = repro_hint(row, session.tier, Path(report_dir or "reports/<run>"), paths.get(row["backend"]),
                      config.getoption("te_impl"))
    report.sections.append(("te_verify repro", hint))
