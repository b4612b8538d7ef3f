"""The errors of tdist_torch's Python group, in the words PyTorch's gloo uses first (what
tests and log alerts written for gloo match), then libtdist's detail, which names the peer rank."""

import datetime
import re

from tdist_torch._lib import _ERR_TIMEOUT, _L, _error_class


def _per_call_ms(timeout):
    """Work.wait's timeout in ms, or None for none (None, or PyTorch's kNoTimeout: 0)."""
    if timeout is None:
        return None
    ms = int(timeout.total_seconds() * 1000) if isinstance(timeout, datetime.timedelta) else int(timeout)
    return ms if ms > 0 else None


def _per_call_timeout(what, ms):
    return _error_class()(
        "tdist %s: Timed out waiting %dms for %s to complete (the timeout given to wait(); the %s "
        "goes on, and wait() again waits for it)" % (what, ms, what, what))


def _detail(pg_handle, st):
    detail = _L.tdist_pg_last_error(pg_handle) or b""
    return detail.decode(errors="replace") or _L.tdist_strerror(st).decode()


def _make_error(pg_handle, what, st, timeout_ms):
    """The error of a failed call: libtdist's message, which names the peer rank. A timeout says
    gloo's words first ("Timed out waiting ...ms for ..."), so log alerts and tests written for
    gloo's wording match it too (_tdist_c.cpp's Core::error_text says the same)."""
    detail = _detail(pg_handle, st)
    if st == _ERR_TIMEOUT:
        return _error_class()("tdist %s failed: Timed out waiting %dms for %s to complete: %s"
                              % (what, timeout_ms, what, detail))
    return _error_class()("tdist %s failed: %s" % (what, detail))


def _monitored_barrier_error(pg_handle, st, rank, timeout_ms, wait_all_ranks):
    """monitored_barrier's error in gloo's words first (ProcessGroupGloo::monitoredBarrier: what
    PyTorch's tests and users' alerts match), then libtdist's detail, which names the ranks."""
    detail = _detail(pg_handle, st)
    if rank != 0:
        words = ("Rank %d successfully reached monitoredBarrier, but received errors while waiting "
                 "for send/recv from rank 0. Please check rank 0 logs for faulty rank." % rank)
    else:
        m = re.search(r"\(([0-9, ]+)\) did not arrive", detail)
        ranks = [int(x) for x in m.group(1).split(",")] if m else [
            int(x) for x in re.findall(r"\brank (\d+)\b", detail) if int(x) != 0][:1]
        if wait_all_ranks and ranks:
            words = "[Rank 0]: Ranks %s failed to pass monitoredBarrier in %d ms" % (
                ", ".join(str(r) for r in ranks), timeout_ms)
        elif timeout_ms == 0:
            words = "Rank 0 timed out in monitoredBarrier after 0 ms."
        elif ranks:
            words = "[Rank 0]: Rank %d failed to pass monitoredBarrier in %d ms" % (ranks[0], timeout_ms)
        else:
            words = "[Rank 0]: monitoredBarrier failed in %d ms" % timeout_ms
    return _error_class()("%s%s tdist monitored_barrier failed: %s" % (words, "" if words.endswith(".") else ".",
                                                                        detail))
