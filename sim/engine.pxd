# Compiled declarations of sim/engine.py (Cython's augmenting .pxd; setup.py builds it, docs/coldstart.md
# "Benchmarks"): the event classes and the environment become extension types whose attributes are C fields, and the
# methods the hot loop calls are C calls. The .py stays the one source of the code and runs as is uncompiled.
# Simulated time (`now`) and delays stay Python objects: the clock is an int until the first timeout, as in SimPy.
cimport cython


cdef class Environment


cdef class Event:
    cdef public Environment env
    cdef public list callbacks
    cdef public object _value
    cdef public bint _ok

    cpdef Event succeed(self, value=*)


cdef class Timeout(Event):
    pass


cdef class Process(Event):
    cdef public object _send
    cdef public object _resume_cb

    @cython.locals(cbs=list)
    cpdef _resume(self, Event event)


cdef class AllDone(Event):
    cdef public Py_ssize_t _left
    cdef public list _waiting

    cpdef part_done(self)


cdef class Environment:
    cdef public object now
    cdef public object _urgent_q
    cdef public object _now_q
    cdef public list _heap
    cdef public Py_ssize_t _eid

    cpdef schedule(self, Event event, object delay)
    cpdef Event event(self)
    cpdef Timeout timeout(self, object delay, object value=*)
    cpdef Process process(self, object generator)
    @cython.locals(ev=Event)
    cpdef call_later(self, object delay, object fn, object arg)
    @cython.locals(heap=list, ev=Event, cbs=list)
    cpdef _loop(self)


@cython.locals(cbs=list)
cpdef _process(Event ev)
