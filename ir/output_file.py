"""Writing a user's output file: checked before the long work, replaced atomically.

`check_output_path` runs when the command line is read, so `--out missing/plan.json`
fails in milliseconds instead of after a search. `write_text_atomic` writes a temporary
file beside the target and renames it over the target: a failure (a full disk) leaves
the old file whole. The new file keeps the old one's permission bits (a 0644 plan stays
0644); a new file gets the usual 0666 minus the umask, as `open` would give it.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile

from ir.errors import PlannerError


def check_output_path(path: str | os.PathLike, flag: str) -> None:
    """Raise unless `path` can be written as a file: its folder exists and is writable,
    and the path is not a folder or a special file. `flag` names the option (`--out`)."""
    target = os.fspath(path)
    if not target:
        raise PlannerError(f"{flag}: empty path; give a file name such as plan.json")
    folder = os.path.dirname(os.path.abspath(target))
    if os.path.isdir(target):
        raise PlannerError(f"{flag} {target}: is a folder; give a file name inside it, such "
                           f"as {os.path.join(target, 'out.json')}")
    if os.path.lexists(target) and not os.path.exists(target):
        raise PlannerError(f"{flag} {target}: is a broken symlink or symlink loop; remove it "
                           "or give another file name")
    if os.path.exists(target) and not stat.S_ISREG(os.stat(target).st_mode):
        raise PlannerError(f"{flag} {target}: is not a regular file; give a file name")
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise PlannerError(f"{flag} {target}: folder {folder} {what}; create it first "
                           f"(mkdir -p {folder}) or write elsewhere")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PlannerError(f"{flag} {target}: folder {folder} is not writable; write "
                           "elsewhere or fix its permissions")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str, what: str = "file") -> None:
    """Write `text` to `path` through a temporary file and a rename, keeping the old
    file's mode; any OSError becomes one PlannerError line naming the path."""
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    except OSError as exc:
        raise PlannerError(f"cannot write {what} {target}: {exc.strerror}") from None
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(target)}.",
                                   suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno == errno.ENOSPC:
            free = shutil.disk_usage(folder).free
            reason += f", {free / 1e6:.0f} MB free"
        raise PlannerError(f"cannot write {what} {target}: {reason}; the previous file (if "
                           "any) is unchanged") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
