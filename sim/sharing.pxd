# Compiled declarations of sim/sharing.py (Cython's augmenting .pxd; setup.py builds it, docs/coldstart.md
# "Benchmarks"): jobs and shared resources become extension types whose attributes are C fields; the hot methods are
# C calls with C doubles for their float locals (the same IEEE operations in the same order as the interpreter's: the
# build forbids contracting them into fused multiply-adds). Methods with closures (`Cores._entities`, ...) stay
# Python-level. `sim.flash.Flash` subclasses `SharedRate` in Python and overrides `_share` (a cpdef: still honoured).
cimport cython

from sim.engine cimport AllDone, Environment, Event


cdef class _Job:
    cdef public double left, cap, weight, rate, eps, slow, slow_mem
    cdef public Event event
    cdef public AllDone part_of
    cdef public object random, request, owner
    cdef public bint memory, neutral


cdef class SharedRate:
    cdef public Environment env
    cdef public double capacity
    cdef public list active
    cdef public double last
    cdef public Py_ssize_t gen
    cdef public bint record
    cdef public list samples
    cdef public list listeners
    cdef public Py_ssize_t n_slow
    cdef public object _timer
    cdef public bint _plain_share
    cdef public bint uniform_caps

    @cython.locals(now=double, dt=double, j=_Job, job=_Job, left=double, eps=double, s0=double, s1=double, ev=Event)
    cpdef use(self, double amount, double cap, double weight=*, object owner=*, object slow=*, bint memory=*,
              bint neutral=*, AllDone part_of=*)
    @cython.locals(job=_Job)
    cpdef bint cancel(self, Event ev)
    @cython.locals(now=double, dt=double, j=_Job)
    cpdef _advance(self)
    @cython.locals(left=double, jobs=list, j=_Job, wsum=double, fair=double, cap=double, rate=double)
    cpdef _share(self)
    @cython.locals(env=Environment, active=list, dt=double, n=Py_ssize_t, j=_Job, k=_Job, rate=double, rk=double,
                   d=double, now=double, at=double, below=bint, caps=double)
    cpdef _reschedule(self)
    @cython.locals(env=Environment, now=double, at=double)
    cpdef _timer_in(self, double dt)
    @cython.locals(now=double, dt=double, active=list, j=_Job, k=_Job, left=double, ev=Event, bar=AllDone, done=list,
                   dj=bint, dk=bint)
    cpdef _on_timer(self, Py_ssize_t gen)
    cpdef _notify(self)
    cpdef refresh(self)


cdef class Cores(SharedRate):
    cdef public double _occ, _occ_t, _busy
    cdef public dict packs
    cdef public double full_at

    cpdef pack(self, object wakee, object waker)
    cpdef unpack(self, object wakee)
    @cython.locals(env=Environment, active=list, j=_Job, n=Py_ssize_t, capacity=double, occ=double, wsum=double,
                   left=double, w=double, fair=double, cap=double, rate=double, d=double, dt=double, now=double,
                   at=double)
    cpdef _reschedule(self)
    @cython.locals(now=double, d=double)
    cpdef _set_occupied(self, double occ)
    @cython.locals(d=double)
    cpdef double busy_core_s(self)
    cpdef run(self, double seconds, object threads=*, object owner=*, object slow=*, bint memory=*, bint neutral=*,
              AllDone part_of=*)
    @cython.locals(j=_Job, base=list, free=double, excess=double, rj=double)
    cpdef _share(self)
