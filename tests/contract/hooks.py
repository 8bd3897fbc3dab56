"""Schemathesis hooks for muster's contract test (tests/it/contract.rs).

JSON Schema counts 3.0 as an integer, so generated bodies may carry integral
floats where the document says `integer`. muster's JSON reader (serde) takes
integers only, and no real client sends `3.0` for a count or a token, so the
floats are written as the integers they are. Nothing else is changed.
"""

import schemathesis


def _ints(value):
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**64:
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


@schemathesis.hook
def map_body(ctx, body):
    return _ints(body)


@schemathesis.hook
def map_query(ctx, query):
    return _ints(query)
