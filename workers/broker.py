"""The embedded broker: kombu's filesystem transport with a write that cannot be read
half-done and a read that cannot kill the worker.

kombu 5.7's ``filesystem`` transport creates a message file under its final name and then
writes it (an advisory ``flock`` the reader never takes). A worker polling the folder can
move and read the file between the two: it reads an empty or partial JSON document,
``loads`` raises ``JSONDecodeError`` out of ``drain_events`` and Celery stops the worker
("Unrecoverable error", exit code 0); the message is lost with it. Seen about once in 8
requests in a sequential stress loop through gunicorn -w 2 at load ~4.

Here:

- **write**: the payload goes to a name the reader's match (``<ts>_<uuid>.<queue>.msg``)
  never accepts (``...msg.writing``), is flushed and ``fsync``-ed, then ``os.replace``-d to
  its name; a rename within one directory is atomic, so a reader sees no file or the whole
  file, from any number of producer processes.
- **read**: a message is taken by ``os.rename`` into ``<folder>/processing/`` (same file
  system: exactly one of several competing workers wins; kombu moved it with
  ``shutil.move`` to ``/tmp``, a copy and delete across file systems), read, then removed.
  A file that cannot be read or parsed is moved to ``<folder>/bad/`` with an error in the
  log and the next message is read: it never reaches Celery as an exception.

``workers.celery`` registers this class for ``filesystem://`` URLs (kombu's alias table),
so the embedded default (``settings.CELERY_BROKER_URL``) and an explicit
``CELERY_BROKER_URL=filesystem://`` both use it.

Once taken, a message lives in the worker's memory until it is acknowledged (kombu's
virtual QoS; put back on a clean shutdown). A worker killed with ``kill -9`` loses the
messages it had taken: its running request is declared lost by the recovery sweep's
heartbeat rule; a queued one (taken, not yet claimed) is re-sent by the sweep's rule 2,
which on this broker waits only ``REQUEST_REQUEUE_AFTER_SECONDS`` = 60 s and re-sends only
requests with no message left in the folder (``pending_request_ids``).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
import uuid
from queue import Empty

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

log = logging.getLogger(__name__)
WRITING_SUFFIX = ".writing"
TASK_NAME = "workers.run_request"


def _fsync_dir(path: str):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Channel(filesystem.Channel):
    """kombu's filesystem channel with an atomic write and a read that survives bad files."""

    #: fsync each message (and its directory) before it is visible: a message the producer
    #: was told is sent survives a power cut. Transport option ``fsync`` (default True).
    @property
    def _fsync(self) -> bool:
        return bool(self.transport_options.get("fsync", True))

    def _put(self, queue, payload, **kwargs):
        """Put ``payload`` onto ``queue``: written under a name no reader matches, then renamed."""
        name = f"{int(round(time.monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        folder = self.data_folder_out
        final = os.path.join(folder, name)
        tmp = final + WRITING_SUFFIX
        try:
            os.makedirs(folder, exist_ok=True)  # removed meanwhile (a tidy-up of var/)
            with open(tmp, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
                f.flush()
                if self._fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, final)
            if self._fsync:
                _fsync_dir(folder)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        """Bind ``queue`` in the exchange's table (``control/<exchange>.exchange``). kombu
        created a missing table with ``open("wb")`` before taking its lock: a second process
        binding at the same moment truncated it, and a publisher reading it then got
        ``b""`` (JSONDecodeError) or nothing to route to. Here a missing table appears whole
        (written aside, then ``os.link``: create-if-absent, atomic) and an existing one is
        updated under kombu's exclusive lock, as before."""
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(parents=True, exist_ok=True)
        queue_val = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        if not file.exists():
            tmp = file.with_name(f".{file.name}.{uuid.uuid4().hex}{WRITING_SUFFIX}")
            try:
                with open(tmp, "wb") as f:
                    f.write(str_to_bytes(dumps([queue_val])))
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, file)
                    return
                except FileExistsError:
                    pass  # another process made it first: add to theirs below
            except OSError as exc:
                raise ChannelError(f"Cannot open {file}") from exc
            finally:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        try:
            with file.open("rb+", buffering=0) as f_obj:
                filesystem.lock(f_obj, filesystem.LOCK_EX)
                try:
                    queues = [filesystem.exchange_queue_t(*q) for q in loads(bytes_to_str(f_obj.read()))]
                    if queue_val not in queues:
                        queues.insert(0, queue_val)
                        f_obj.seek(0)
                        f_obj.write(str_to_bytes(dumps(queues)))
                        f_obj.truncate()
                finally:
                    filesystem.unlock(f_obj)
        except (OSError, ValueError) as exc:
            raise ChannelError(f"Cannot update {file}") from exc

    def get_table(self, exchange):
        """The exchange's table; a table that does not parse is a ``ChannelError`` (Celery
        reconnects), never a ``JSONDecodeError`` that stops the worker."""
        try:
            return super().get_table(exchange)
        except ValueError as exc:
            raise ChannelError(f"Cannot read the table of exchange {exchange!r}: {exc}") from exc

    def _side_folder(self, kind: str) -> str:
        path = os.path.join(self.data_folder_in, kind)
        os.makedirs(path, exist_ok=True)
        return path

    def _names(self) -> list[str]:
        """The folder's file names; a folder removed while the worker runs (a tidy-up of
        ``var/``) is made again and empty: kombu's ``listdir`` raised FileNotFoundError, and
        Celery stopped the worker with exit code 0 (no ``on-failure`` restart)."""
        try:
            return os.listdir(self.data_folder_in)
        except FileNotFoundError:
            log.error("embedded broker: the folder %s was removed; made again (messages in it are lost, the "
                      "recovery sweep re-sends their requests)", self.data_folder_in)
            try:
                os.makedirs(self.data_folder_in, exist_ok=True)
            except OSError as exc:
                raise ChannelError(f"Cannot make the broker's folder {self.data_folder_in!r}") from exc
            return []

    def _size(self, queue):
        queue_find = f"{queue}.msg"
        return sum(name.partition(".")[2] == queue_find for name in self._names())

    def _purge(self, queue):
        queue_find = f"{queue}.msg"
        count = 0
        for name in self._names():
            if name.partition(".")[2] == queue_find:
                try:
                    os.remove(os.path.join(self.data_folder_in, name))
                    count += 1
                except OSError:
                    pass  # taken by a worker meanwhile
        return count

    def _get(self, queue):
        """Take the next message of ``queue``; files that cannot be parsed are set aside."""
        queue_find = f"{queue}.msg"
        for filename in sorted(self._names()):
            if filename.partition(".")[2] != queue_find:
                continue
            src = os.path.join(self.data_folder_in, filename)
            taken = os.path.join(self._side_folder("processing"), filename)
            try:
                os.rename(src, taken)  # atomic: one taker wins
            except OSError:
                continue  # taken by another worker, or gone
            raw = b""
            try:
                with open(taken, "rb") as f:
                    raw = f.read()
                payload = loads(bytes_to_str(raw))
                if not isinstance(payload, dict):
                    raise ValueError(f"a message is a JSON object, not {type(payload).__name__}")
            except Exception as exc:  # noqa: BLE001 - whatever is wrong with the file, the worker goes on
                self._set_aside(taken, filename, raw, exc)
                continue
            if self.store_processed:
                try:
                    os.replace(taken, os.path.join(self.processed_folder, filename))
                except OSError:
                    pass
            else:
                try:
                    os.remove(taken)
                except OSError:
                    pass
            return payload
        raise Empty()

    def _set_aside(self, taken: str, filename: str, raw: bytes, exc: Exception):
        bad = os.path.join(self._side_folder("bad"), filename)
        try:
            os.replace(taken, bad)
        except OSError:
            bad = taken
        log.error("embedded broker: message file %s could not be read (%s: %s; %d bytes); moved to %s, "
                  "the worker goes on", filename, type(exc).__name__, str(exc)[:200], len(raw), bad)


class Transport(filesystem.Transport):
    Channel = Channel
    driver_type = "filesystem"
    driver_name = "filesystem-atomic"


def register():
    """``filesystem://`` URLs use this transport (kombu's alias table; idempotent)."""
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES["filesystem"] = "workers.broker:Transport"


def request_id_of(payload: dict) -> str | None:
    """The request id a message of ``workers.run_request`` carries, else None."""
    try:
        if (payload.get("headers") or {}).get("task") != TASK_NAME:
            return None
        props = payload.get("properties") or {}
        body = payload["body"]
        if props.get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]  # protocol 2: [args, kwargs, embed]
        return str(args[0]) if args else None
    except Exception:  # noqa: BLE001
        return None


def pending_request_ids(folder) -> set[str]:
    """The request ids of ``workers.run_request`` messages in the embedded broker's folder
    (written, not yet taken by a worker). Unreadable files count for nothing."""
    out = set()
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        if not name.endswith(".msg"):
            continue
        try:
            with open(os.path.join(folder, name), "rb") as f:
                payload = json.loads(f.read())
        except (OSError, ValueError):
            continue
        rid = request_id_of(payload) if isinstance(payload, dict) else None
        if rid:
            out.add(rid)
    return out


def redis_pending_request_ids(connection, queues) -> set[str]:
    """The request ids of ``workers.run_request`` messages a Redis broker holds: waiting in
    ``queues`` (kombu's list per queue and priority step) or delivered to a worker and not
    yet acknowledged (kombu's ``unacked`` hash, where a message a dead worker had taken
    waits for the visibility timeout). ``connection``: a kombu Connection to the broker.
    Raises on a broker that cannot be read (the caller then re-sends nothing)."""
    channel = connection.default_channel
    client = channel.client
    payloads = []
    for queue in sorted(set(queues)):
        for pri in channel.priority_steps:
            payloads += [_json(raw) for raw in client.lrange(channel._q_for_pri(queue, pri), 0, -1)]
    for value in client.hvals(channel.unacked_key):  # [message, exchange, routing key]
        value = _json(value)
        payloads.append(value[0] if isinstance(value, list) and value else None)
    return {rid for p in payloads if isinstance(p, dict) and (rid := request_id_of(p))}


def _json(raw):
    try:
        return json.loads(raw)
    except (ValueError, TypeError):
        return None
