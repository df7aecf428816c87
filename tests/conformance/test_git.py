"""The E2B SDK's git module (sandbox.git), which runs git in the sandbox
through the process service, and sudo for the sandbox's user. The default
template ships git and lets `user` sudo without a password, as E2B's does.
Remotes are repositories inside the sandbox: tests have no internet."""

from __future__ import annotations

import pytest

from e2b import CommandExitException, Sandbox

pytestmark = pytest.mark.timeout(120)

REPO = "/home/user/repo"
REMOTE = "/home/user/remote.git"
CLONE = "/home/user/clone"


@pytest.fixture(scope="module")
def sbx(module_sandbox_factory) -> Sandbox:
    sbx = module_sandbox_factory()
    sbx.git.configure_user("Cellfork Test", "test@example.com")
    return sbx


def test_init_add_commit_status_branches(sbx: Sandbox) -> None:
    sbx.git.init(REPO, initial_branch="main")
    sbx.files.write(f"{REPO}/a.txt", "one\n")
    status = sbx.git.status(REPO)
    assert status.current_branch == "main"
    assert [f.name for f in status.file_status] == ["a.txt"]
    assert status.file_status[0].status == "untracked"

    sbx.git.add(REPO)
    assert sbx.git.status(REPO).file_status[0].staged
    sbx.git.commit(REPO, "first")
    assert sbx.git.status(REPO).file_status == []
    log = sbx.commands.run("git log --format='%an <%ae> %s'", cwd=REPO).stdout
    assert log == "Cellfork Test <test@example.com> first\n"

    sbx.git.create_branch(REPO, "feature")
    assert sbx.git.branches(REPO).current_branch == "feature"
    sbx.git.checkout_branch(REPO, "main")
    branches = sbx.git.branches(REPO)
    assert sorted(branches.branches) == ["feature", "main"] and branches.current_branch == "main"
    sbx.git.delete_branch(REPO, "feature")
    assert sbx.git.branches(REPO).branches == ["main"]


def test_restore_and_reset(sbx: Sandbox) -> None:
    repo = REPO + "-undo"
    sbx.git.init(repo, initial_branch="main")
    sbx.files.write(f"{repo}/a.txt", "kept\n")
    sbx.git.add(repo)
    sbx.git.commit(repo, "base")

    sbx.files.write(f"{repo}/a.txt", "scribbled\n")
    sbx.git.restore(repo, ["a.txt"])
    assert sbx.files.read(f"{repo}/a.txt") == "kept\n"

    sbx.files.write(f"{repo}/a.txt", "staged\n")
    sbx.git.add(repo)
    sbx.git.reset(repo, mode="hard", target="HEAD")
    assert sbx.files.read(f"{repo}/a.txt") == "kept\n"
    assert sbx.git.status(repo).file_status == []


def test_remote_push_clone_pull(sbx: Sandbox) -> None:
    sbx.git.init(REMOTE, bare=True, initial_branch="main")
    repo = REPO + "-pushed"
    sbx.git.init(repo, initial_branch="main")
    sbx.files.write(f"{repo}/readme", "v1\n")
    sbx.git.add(repo)
    sbx.git.commit(repo, "v1")
    sbx.git.remote_add(repo, "origin", REMOTE)
    assert sbx.git.remote_get(repo, "origin") == REMOTE
    sbx.git.push(repo, remote="origin", branch="main")

    sbx.git.clone(REMOTE, path=CLONE, branch="main")
    assert sbx.files.read(f"{CLONE}/readme") == "v1\n"

    sbx.files.write(f"{CLONE}/readme", "v2\n")
    sbx.git.add(CLONE)
    sbx.git.commit(CLONE, "v2")
    sbx.git.push(CLONE)
    sbx.git.pull(repo, remote="origin", branch="main")
    assert sbx.files.read(f"{repo}/readme") == "v2\n"
    assert sbx.git.status(repo).ahead == 0


def test_config(sbx: Sandbox) -> None:
    sbx.git.set_config("cellfork.answer", "42")
    assert sbx.git.get_config("cellfork.answer") == "42"
    sbx.git.set_config("cellfork.local", "yes", scope="local", path=REPO)
    assert sbx.git.get_config("cellfork.local", scope="local", path=REPO) == "yes"


def test_git_errors_are_command_errors(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/not-a-repo")
    with pytest.raises(CommandExitException) as exc:
        sbx.git.status("/home/user/not-a-repo")
    assert exc.value.exit_code == 128 and "not a git repository" in exc.value.stderr


def test_user_may_sudo(sbx: Sandbox) -> None:
    assert sbx.commands.run("whoami").stdout == "user\n"
    assert sbx.commands.run("sudo -n id -u").stdout == "0\n"
    # Root through sudo still cannot lift the sandbox's process limits.
    with pytest.raises(CommandExitException):
        sbx.commands.run("sudo -n sh -c 'ulimit -Hn $(( $(ulimit -Hn) + 1 ))'")
