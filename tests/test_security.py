"""Security: where the dashboard listens, who may use it, what it accepts from a browser,
and the Docker image.

- `serve` binds 127.0.0.1 unless `--host` says otherwise; off loopback it warns, and with
  a token (--token / $GRPO_HEALTH_TOKEN) every page, app.py and each page file opened
  directly, shows only a password box until the token matches (hmac.compare_digest).
- Nothing typed in a browser is imported or run; typed paths stay inside the allowed
  folders (the form cases are in tests/test_bad_input.py; the policy is grpo_core/dashboard/access.py).
- XSRF protection stays on; the Dockerfile lints clean and its CMD is a valid serve command.
"""
from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from grpo_core.__main__ import build_parser, main
from grpo_core.dashboard import access, serve
from grpo_core.errors import ConfigError
from grpo_core.runs import run_index
from tests.helpers_dashboard import CHROMIUM, REPO, answers, app_test, free_port, live_charts, synth_run, wait_for

TOKEN = "s3cret-token-for-tests"
PAGES = ["pages/runs.py", "pages/live.py", "pages/analysis.py", "pages/pilot.py"]


# ---- serve: bind address, warning, token and redraw rate hand-over -----------------------------------------
@pytest.fixture
def launched(monkeypatch):
    """serve() with Streamlit replaced by a recorder: the command and env it would start."""
    seen = {}

    class Fake:
        def __init__(self, cmd, cwd=None, env=None):
            seen.update(cmd=cmd, env=env)

        def wait(self, timeout=None):
            return 0
    monkeypatch.setattr(serve.subprocess, "Popen", Fake)
    monkeypatch.delenv(access.TOKEN_ENV, raising=False)
    return seen


def address(cmd: list[str]) -> str:
    return cmd[cmd.index("--server.address") + 1]


def test_serve_binds_loopback_by_default_without_a_warning(launched, runs_dir, capsys):
    assert main(["serve", "--no-demo", "--port", "9"]) == 0
    assert address(launched["cmd"]) == "127.0.0.1"
    assert "warning:" not in capsys.readouterr().err and access.TOKEN_ENV not in launched["env"]
    cfg = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    assert cfg["server"]["address"] == "127.0.0.1"  # `streamlit run app.py` too


def test_serve_wider_warns_and_hands_the_token_over_by_env_only(launched, runs_dir, capsys):
    assert main(["serve", "--no-demo", "--port", "9", "--host", "0.0.0.0"]) == 0
    err = capsys.readouterr().err
    assert address(launched["cmd"]) == "0.0.0.0"
    assert "warning: listening on 0.0.0.0:9" in err and "No token set" in err
    assert main(["serve", "--no-demo", "--port", "9", "--host", "0.0.0.0", "--token", TOKEN]) == 0
    err = capsys.readouterr().err
    assert "Every browser must give the token first" in err
    assert launched["env"][access.TOKEN_ENV] == TOKEN and TOKEN not in " ".join(launched["cmd"])


def test_serve_hands_the_viewers_redraw_rate_over_and_refuses_a_bad_one(launched, runs_dir, capsys, monkeypatch):
    """--redraws-per-s reaches the Streamlit it starts as $GRPO_HEALTH_REDRAWS_PER_S (the flag wins
    over the variable); a bad value stops serve in one line before anything starts."""
    from grpo_core.dashboard import live_cache
    assert main(["serve", "--no-demo", "--port", "9"]) == 0
    assert launched["env"][live_cache.REDRAWS_ENV] == "1.5"  # the default, said explicitly
    monkeypatch.setenv(live_cache.REDRAWS_ENV, "0.5")
    assert main(["serve", "--no-demo", "--port", "9", "--redraws-per-s", "6"]) == 0
    assert launched["env"][live_cache.REDRAWS_ENV] == "6.0"
    launched.clear()
    assert main(["serve", "--no-demo", "--port", "9", "--redraws-per-s", "0"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == ("error: --redraws-per-s / $GRPO_HEALTH_REDRAWS_PER_S must be a number above 0 "
                                            "(how often a run's open pages together are redrawn, per second; default 1.5), got '0'")
    assert launched == {}  # nothing started


def test_a_short_token_is_refused_in_one_line(launched, runs_dir, capsys):
    assert main(["serve", "--no-demo", "--host", "0.0.0.0", "--token", "short"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --token / $GRPO_HEALTH_TOKEN must be at least 8 characters"] and not launched


def listening(port: int) -> set[str]:
    """Local addresses with a socket listening on `port` (from /proc/net/tcp{,6})."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            host, p = local.split(":")
            if int(p, 16) == port and state == "0A":  # LISTEN
                found.add({"0100007F": "127.0.0.1", "00000000": "0.0.0.0"}.get(host, host))
    return found


@pytest.mark.slow
def test_real_servers_bind_where_told_keep_xsrf_on_refuse_parent_frames_and_keep_the_token_off_the_command_line(runs_dir, tmp_path):
    synth_run(runs_dir, "secret-run", 3, status="finished").close()
    ports = {"default": free_port(), "wide": free_port()}
    env = {**os.environ, "GRPO_HEALTH_RUNS_DIR": str(runs_dir)}
    logs = {k: open(tmp_path / f"{k}.log", "w") for k in ports}
    procs = {"default": subprocess.Popen([sys.executable, "-m", "grpo_core", "serve", "--no-demo", "--port",
                                          str(ports["default"])], cwd=REPO, env=env, stdout=logs["default"],
                                         stderr=subprocess.STDOUT, start_new_session=True),
             "wide": subprocess.Popen([sys.executable, "-m", "grpo_core", "serve", "--no-demo", "--port",
                                       str(ports["wide"]), "--host", "0.0.0.0"], cwd=tmp_path,  # from any folder
                                      env={**env, access.TOKEN_ENV: TOKEN}, stdout=logs["wide"],
                                      stderr=subprocess.STDOUT, start_new_session=True)}
    try:
        for k, port in ports.items():
            wait_for(lambda: answers(f"http://127.0.0.1:{port}"), 120, what=f"the {k} server")
        assert listening(ports["default"]) == {"127.0.0.1"}
        assert listening(ports["wide"]) == {"0.0.0.0"}
        for port in ports.values():  # XSRF on: a write without the XSRF token is refused before anything else
            req = urllib.request.Request(f"http://127.0.0.1:{port}/_stcore/upload_file/some-session/some-file",
                                         data=b"x", method="PUT")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=10)
            assert refused.value.code == 403 and b"XSRF" in refused.value.read()
        pages = {k: urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read().decode() for k, port in ports.items()}
        assert 'data-run="secret-run"' in pages["default"]  # the live page's HTML brings its run's first chart
        assert "secret-run" not in pages["wide"] and "grpo-first-paint" not in pages["wide"]  # not before the token
        for port in ports.values():  # no parent frame may steer the pages (config.toml's empty list, read beside asgi.py)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/host-config", timeout=10) as answer:
                assert json.loads(answer.read())["allowedOrigins"] == []
        children = subprocess.run(["pgrep", "-f", f"server.port {ports['wide']}"], capture_output=True, text=True)
        for pid in children.stdout.split():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            assert TOKEN not in cmdline and "enableXsrfProtection\0true\0" in cmdline  # config.toml's, as a flag
        assert "warning: listening on 0.0.0.0" in (tmp_path / "wide.log").read_text()
        if Path(CHROMIUM).exists():  # the first page a fresh server runs for /runs is pages/runs.py, not app.py
            assert first_view(ports["wide"], "runs") == (True, False)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
        for f in logs.values():
            f.close()


def first_view(port: int, path: str) -> tuple[bool, bool]:
    """(token box shown, secret run shown) for a browser's first visit to /<path>."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu",
                                                                      "--disable-background-networking"])
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{port}/{path}", wait_until="domcontentloaded")
        page.get_by_text("Access token").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1000)  # anything else the script would draw
        body = page.inner_text("body")
        browser.close()
    return "Access token" in body, "secret-run" in body


def test_xsrf_protection_stays_on():
    cfg = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    assert cfg["server"]["enableXsrfProtection"] is True
    flags = " ".join(serve.streamlit_command(8501, host="0.0.0.0"))
    dockerfile = (REPO / "Dockerfile").read_text()
    for text in (flags, dockerfile, (REPO / "Makefile").read_text()):
        assert not re.search(r"enableXsrfProtection[= ]+(false|0)", text, re.I)
        assert not re.search(r"enableCORS[= ]+(false|0)", text, re.I)


# ---- the token gate ----------------------------------------------------------------------------------------
def gated(path: str) -> AppTest:
    at = AppTest.from_file(str(REPO / path), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def shows_nothing_but_the_box(at: AppTest, secret_run: str):
    assert [t.label for t in at.text_input] == ["Access token"]
    assert at.text_input[0].proto.type == at.text_input[0].proto.PASSWORD
    assert not at.sidebar.selectbox and not at.button and not live_charts(at)
    assert secret_run not in json.dumps([str(e.proto) for e in at.main])


@pytest.mark.parametrize("path", ["app.py", *PAGES])
def test_with_a_token_every_page_shows_only_the_token_box(runs_dir, monkeypatch, path):
    monkeypatch.setenv(access.TOKEN_ENV, TOKEN)
    synth_run(runs_dir, "secret-run", 3).close()
    at = gated(path)  # a page file opened directly: what a fresh server runs for its URL, without app.py
    shows_nothing_but_the_box(at, "secret-run")
    at.text_input[0].set_value("wrong-token-123").run()
    assert not at.exception and [e.value for e in at.error] == ["That token does not match."]
    shows_nothing_but_the_box(at, "secret-run")


def test_the_right_token_opens_the_app_for_that_session_only(runs_dir, monkeypatch):
    monkeypatch.setenv(access.TOKEN_ENV, TOKEN)
    synth_run(runs_dir, "secret-run", 3).close()
    at = gated("app.py")
    at.text_input[0].set_value(TOKEN).run()  # the live page's first paint: the run line and its charts
    assert not at.exception and live_charts(at) and at.session_state["run_id"] == "secret-run"
    at.run()  # the rest, with the run picker
    assert not at.exception and at.sidebar.selectbox
    at.switch_page("pages/runs.py").run()
    assert not at.exception and any("secret-run" in m.value for m in at.markdown)
    other = gated("app.py")  # another browser session asks again
    shows_nothing_but_the_box(other, "secret-run")


def test_without_a_token_nothing_is_asked(runs_dir, monkeypatch):
    monkeypatch.delenv(access.TOKEN_ENV, raising=False)
    synth_run(runs_dir, "r", 3).close()
    at = gated("app.py")
    assert "Access token" not in [t.label for t in at.text_input] and live_charts(at)


def test_token_compare_is_constant_time(monkeypatch):
    calls = []
    real = access.hmac.compare_digest
    monkeypatch.setattr(access.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    assert access.token_matches(TOKEN, TOKEN) and not access.token_matches(TOKEN[:-1], TOKEN)
    assert not access.token_matches("", TOKEN) and not access.token_matches(None, TOKEN)
    assert len(calls) == 4 and access.token_matches("anything", "")  # no token set: open


# ---- nothing typed in a browser is executed ----------------------------------------------------------------
BUILTINS = {"eval", "exec", "compile", "__import__"}  # called by name
METHODS = {"import_module", "load_metric", "build_metrics", "system", "popen", "run_path"}  # called as x.name


def test_no_page_evaluates_or_imports_text():
    """app.py and the pages call no eval/exec/import-by-name/pickle and never load a metric."""
    for path in ["app.py", *PAGES]:
        tree = ast.parse((REPO / path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                bad = (isinstance(f, ast.Name) and f.id in BUILTINS | METHODS) or \
                    (isinstance(f, ast.Attribute) and f.attr in METHODS)
                assert not bad, f"{path}:{node.lineno} calls {ast.unparse(f)}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(m.split(".")[0] in ("pickle", "importlib", "subprocess", "runpy") for m in mods), path


def test_a_custom_metric_typed_in_the_start_form_is_never_imported(runs_dir, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "evil_metric.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\ndef fn(c, e): return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    at = app_test()
    at.run()
    at.switch_page("pages/runs.py").run()
    next(t for t in at.text_area if t.label.startswith("More settings")).set_value(
        'reward.custom.x="evil_metric:fn"\nreward.weights.x=1.0')
    next(b for b in at.button if b.label == "Start run").click().run()
    assert not at.exception
    assert any("custom reward functions cannot be set from the dashboard" in e.value for e in at.error)
    time.sleep(0.5)
    assert not marker.exists() and run_index.list_runs(runs_dir).empty  # not imported here, no trainer to import it


def test_typed_paths_resolve_inside_the_allowed_folders(runs_dir, tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    (outside / "model").mkdir(parents=True)
    (runs_dir / "link").symlink_to(outside / "model")  # inside by name, outside in fact
    with pytest.raises(ConfigError, match="is outside the folders"):
        access.check_ui_path("model.path", str(runs_dir / "link"), "dir")
    with pytest.raises(ConfigError, match="is outside the folders"):
        access.check_ui_path("model.path", str(runs_dir / ".." / "outside" / "model"), "dir")
    monkeypatch.setenv(access.ALLOWED_ENV, str(outside))  # the operator allows it
    assert access.check_ui_path("model.path", str(runs_dir / "link"), "dir") == str((outside / "model").resolve())
    with pytest.raises(ConfigError, match="no such file"):
        access.check_ui_path("task.dataset", str(outside / "model"), "file")
    monkeypatch.chdir(REPO)  # a relative path is the dashboard's working dir (serve runs it in the repo)
    assert access.check_ui_path("model.path", "grpo_core", "dir") == str(REPO / "grpo_core")


# ---- Docker ------------------------------------------------------------------------------------------------
def test_dockerfile_lints_clean_and_installs_like_the_makefile():
    from tests.check_dockerfile import problems
    assert problems() == []


def test_dockerfile_cmd_is_a_valid_serve_command_on_all_interfaces():
    text = (REPO / "Dockerfile").read_text()
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    assert cmd[:3] == ["python", "-m", "grpo_core"]
    args = build_parser().parse_args(cmd[3:])  # argparse exits on an unknown flag
    assert args.command == "serve" and args.host == "0.0.0.0" and args.port == 8501
