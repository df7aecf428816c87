"""Resource limits at create (cellfork extensions) against the real
daemon: what is asked for is what the sandbox's processes get, and what
get_info reports; out of bounds is an InvalidArgumentError."""

import pytest

from cellfork import AsyncSandbox, InvalidArgumentError, Sandbox

pytestmark = pytest.mark.integration


def test_create_with_limits(new_sandbox):
    sb = new_sandbox(memory_mb=768, disk_size_mb=128, pids_max=100, open_files=1000)
    info = sb.get_info()
    assert (info.memory_mb, info.disk_size_mb, info.pids_max, info.open_files) == (768, 128, 100, 1000)
    assert info.boot_mode == "boot"  # another disk size than the template's
    out = sb.commands.run("echo $(ulimit -u) $(ulimit -n) $(df -m --output=size / | tail -1)").stdout
    assert out.split() == ["100", "1000", "128"]
    ex = sb.run_code("import resource as r\nprint(r.getrlimit(r.RLIMIT_NPROC)[1], r.getrlimit(r.RLIMIT_NOFILE)[1])")
    assert ex.logs.stdout == ["100 1000\n"]


def test_limits_out_of_bounds(client_kwargs, run_tag, no_leaked_sandboxes):
    for kwargs in ({"pids_max": 0}, {"open_files": 10}, {"memory_mb": 1 << 30}):
        with pytest.raises(InvalidArgumentError) as err:
            Sandbox.create(metadata=run_tag, **kwargs, **client_kwargs)
        assert err.value.status_code == 400
        key = {"pids_max": "pidsMax", "open_files": "openFiles", "memory_mb": "memoryMB"}[next(iter(kwargs))]
        assert key in str(err.value)


async def test_async_create_with_limits(client_kwargs, run_tag, no_leaked_sandboxes):
    async with await AsyncSandbox.create(timeout=120, metadata=run_tag, pids_max=64, **client_kwargs) as sb:
        assert (await sb.get_info()).pids_max == 64
        assert (await sb.commands.run("ulimit -u")).stdout == "64\n"
