"""Run directories: their layout, the one status rule, claiming them, and what each
run records about its environment. Standard library only, so every other room (the
events reader, the monitor, the viewer, the cleaner) may import it.
"""

from msmon_nb.rundir.claim import backup_config, claim_rank_dir, claim_run_dir, default_run_name
from msmon_nb.rundir.facts import environment
from msmon_nb.rundir.layout import (
    ALERTS,
    CONFIG_BACKUP,
    MARKER,
    RECENT_SECS,
    SNAPSHOTS,
    append_jsonl,
    combined_status,
    find_run_dirs,
    is_run_dir,
    is_summary_file,
    marker_alive,
    pid_alive,
    rank_markers,
    rank_of_dir,
    read_jsonl,
    read_marker,
    read_marker_file,
    read_run_jsonl,
    run_files,
    run_status,
    summary_file_key,
    summary_file_rank,
    write_marker,
)

__all__ = [
    "ALERTS",
    "CONFIG_BACKUP",
    "MARKER",
    "RECENT_SECS",
    "SNAPSHOTS",
    "append_jsonl",
    "backup_config",
    "claim_rank_dir",
    "claim_run_dir",
    "combined_status",
    "default_run_name",
    "environment",
    "find_run_dirs",
    "is_run_dir",
    "is_summary_file",
    "marker_alive",
    "pid_alive",
    "rank_markers",
    "rank_of_dir",
    "read_jsonl",
    "read_marker",
    "read_marker_file",
    "read_run_jsonl",
    "run_files",
    "run_status",
    "summary_file_key",
    "summary_file_rank",
    "write_marker",
]
