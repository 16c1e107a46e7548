# SPDX-License-Identifier: MIT
"""The vocabulary of the robustness sweep (tests/robustness/
test_robustness.py): its bad values (``BAD``), its groups of cases
(``GROUPS``) and the two ways to add cases, ``case`` and ``sweep``.

The cases themselves are in robust_cases_arrays.py (allocation,
transfers, the array interfaces, copies, indexing, layout) and
robust_cases_runtime.py (streams, contexts, host memory, memory
managers, IPC, kernels, re-entrancy, constructors, zero-itemsize dtypes,
misuse); ``groups()`` imports both and gives every group.  Imported by
the test module and by its child processes, which run the cases with
robust_prelude.py's names in scope.
"""

# Bad values for an argument, by name: Python source evaluated in the
# child with tests/helpers/robust_prelude.py's names in scope.
BAD = {
    "None": "None",
    "True": "True",
    "neg": "-1",
    "2**63": "2**63",
    "2**64": "2**64",
    "10**30": "10**30",
    "-2**63-1": "-2**63-1",
    "float": "1.5",
    "nan": "float('nan')",
    "inf": "float('inf')",
    "complex": "1j",
    "str": "'x'",
    "bytes": "b'xy'",
    "list": "[]",
    "dict": "{}",
    "object": "object()",
    "RaiseIndex": "RaiseIndex()",
    "GarbageIndex": "GarbageIndex()",
    "HugeIndex": "HugeIndex()",
    "RaiseSeq": "RaiseSeq()",
    "LyingSeq": "LyingSeq()",
    "RaiseBool": "RaiseBool()",
    "objarr": "np.empty(2, object)",
    "np.float64": "np.float64(2.0)",
    "np.int64(-5)": "np.int64(-5)",
    "device_array": "cuda.device_array(3)",
    "stream": "cuda.stream()",
    "event": "cuda.event()",
}

# A case: (name, source, expect).  expect is "ok" (must return), "any"
# (return or raise, but no SystemError), "raise" (any exception but
# SystemError), or exception class names separated by "|" (Boom, the
# prelude's exception, is always accepted: an adversarial object's own
# exception may propagate).
GROUPS = {}


def case(group, name, source, expect="raise"):
    GROUPS.setdefault(group, []).append((name, source, expect))


def sweep(group, template, slots, expect="raise", overrides=None,
          values=BAD):
    """For each slot of ``template`` (a str.format template with one field
    per argument, ``slots`` maps field to its good value), one case per
    bad value with the others good.  ``overrides`` maps (field, value
    name) or value name to an expectation."""
    overrides = overrides or {}
    for field in slots:
        for vname, vsrc in values.items():
            args = dict(slots)
            args[field] = vsrc
            src = template.format(**args)
            exp = overrides.get((field, vname),
                                overrides.get(vname, expect))
            case(group, "%s[%s=%s]" % (template.split("(")[0].strip(),
                                       field, vname), src, exp)


def groups():
    """Every group of the sweep: {group: [(name, source, expect), ...]}
    (importing the case modules fills GROUPS)."""
    from helpers import robust_cases_arrays, robust_cases_runtime  # noqa: F401

    return GROUPS
