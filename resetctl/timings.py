"""``resetctl export-timings``: the trace writer, which lives with the reader in
:mod:`resetctl.replay.traces`; kept here for the command and callers that import it."""

from resetctl.replay.traces import export_timings

__all__ = ["export_timings"]
