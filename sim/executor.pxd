# Compiled declarations of sim/executor.py (Cython's augmenting .pxd; setup.py builds it, docs/coldstart.md
# "Benchmarks"): the executor becomes an extension type whose resources and counters are C fields, and the steps every
# task takes (memory, barriers, completion) are C calls. The .py stays the one source and runs as is uncompiled.
cimport cython

from sim.engine cimport AllDone, Environment, Event
from sim.sharing cimport Cores, SharedRate


cdef class PlanExecutor:
    cdef dict __dict__                  # instance attributes beyond these (a test wraps a method of one executor)
    cdef public object plan, dev, cost, rt, preloaded, driver, gil, dispatch, mem, peak_mem, gil_last
    cdef public Environment env
    cdef public Cores cores
    cdef public SharedRate flash, dram
    cdef public Py_ssize_t n_tasks, gil_waits, idle_wakes, reading, loading, pool_wakes, packed_wakes
    cdef public dict idle, waits_by, ra, stream_end, pool_spin, _corun
    cdef public Event all_done
    cdef public list spans, pool, mem_samples
    cdef public set staged, sleeping
    cdef public double pack_acc

    cpdef _wake(self, list resources, object waker=*)
    cpdef _mem(self, object delta)
    cpdef _after(self, list wake, list joins, object waker=*)
    @cython.locals(dram=bint, done=AllDone, th=double)
    cpdef AllDone _occupied(self, double seconds, object threads, double dram_bytes, bint on_core=*, object owner=*,
                            object cls=*)
    cpdef AllDone _runtime(self, double seconds, object owner=*)
    cpdef _end(self, object t, Py_ssize_t tid, bint stolen, str resource, Py_ssize_t idx, object start, object unit,
               object cpu_s)
