# Compiled declarations of planner/pipeline/dispatch.py (Cython's augmenting .pxd; setup.py builds it,
# docs/coldstart.md "Benchmarks"): the dispatcher becomes an extension type whose counters are C fields and whose
# internal steps are C calls. The .py stays the one source and runs as is uncompiled (the HIL runner uses either).
cimport cython


cdef class Dispatcher:
    cdef public object plan
    cdef public object tasks
    cdef public list left
    cdef public list children
    cdef public dict queues
    cdef public dict next_order
    cdef public bint position
    cdef public object thr
    cdef public Py_ssize_t done

    cpdef tuple complete(self, Py_ssize_t tid)
    @cython.locals(nq=list)
    cpdef pop(self, str resource)
    cpdef tuple _key(self, Py_ssize_t tid)
    cpdef _ready(self, Py_ssize_t tid, list wake, list joins)
    @cython.locals(c=Py_ssize_t)
    cpdef _release(self, Py_ssize_t tid, list wake, list joins)
    @cython.locals(q=list)
    cpdef bint _head_ok(self, str resource)
    cpdef tuple _taken(self, str resource, bint stolen)
