"""Drops finished runs' namespaces off the init's path (stdlib only: loaded by the fork server with
`run_init.py`; ``threading`` is imported on first use, so a run's Python does not find it preloaded)."""

import os


class NamespaceDropper:
    """Closes finished runs' namespace fds in a thread (each close may wait for an RCU grace
    period); `wait_idle` returns once every namespace handed over so far is gone (its tmpfs too)."""

    def __init__(self):
        import threading

        self.cond = threading.Condition()
        self.todo = []
        self.busy = False
        threading.Thread(target=self._drop, name="drop-namespaces", daemon=True).start()

    def put(self, fds):
        with self.cond:
            self.todo.append(fds)
            self.cond.notify_all()

    def wait_idle(self):
        with self.cond:
            self.cond.wait_for(lambda: not self.todo and not self.busy)

    def _drop(self):
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.todo)
                fds, self.busy = self.todo.pop(0), True
            for fd in fds:
                os.close(fd)
            with self.cond:
                self.busy = bool(self.todo)
                self.cond.notify_all()
