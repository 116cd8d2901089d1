"""koordlet/goflag.py held to Go's own tables.

Every row below is a case of Go's test suite, with the value or error Go's tests expect (golang/go, go1.2x):
``strconv/atoi_test.go`` (parseInt64BaseTests and parseUint64BaseTests, the base 0 rows: what ``flag.Int`` and
``flag.Uint`` parse), ``strconv/atof_test.go`` (atoftests, 64-bit), ``strconv/quote_test.go`` (quotetests),
``time/time_test.go`` (parseDurationTests, parseDurationErrorTests, durationTests) and ``flag/flag_test.go``
(TestPrintDefaults, TestParseError, TestRangeError, TestExitCode). Go's invalid UTF-8 bytes are written here as
Python's surrogateescape carries them in ``sys.argv`` (``\\xff`` as ``\\udcff``).

Each table runs twice: on the strconv/time function (Go's value or NumError text) and through a FlagSet of that
Go type (the value, or the flag package's ``parse error`` / ``value out of range``).
"""

from __future__ import annotations

import math

import pytest

from koordlet import goflag

NS, US, MS, S, M, H = 1, 1_000, 1_000_000, 1_000_000_000, 60_000_000_000, 3_600_000_000_000
SYNTAX, RANGE = "invalid syntax", "value out of range"  # strconv.ErrSyntax, strconv.ErrRange

# strconv.ParseInt(s, 0, 64): parseInt64BaseTests, base 0 rows, as (in, out, err).
PARSE_INT_BASE0 = [
    ("", 0, SYNTAX), ("0", 0, None), ("-0", 0, None), ("1", 1, None), ("-1", -1, None), ("12345", 12345, None),
    ("-12345", -12345, None), ("012345", 0o12345, None), ("-012345", -0o12345, None), ("0x12345", 0x12345, None),
    ("-0X12345", -0x12345, None), ("12345x", 0, SYNTAX), ("-12345x", 0, SYNTAX), ("98765432100", 98765432100, None),
    ("-98765432100", -98765432100, None), ("9223372036854775807", (1 << 63) - 1, None),
    ("-9223372036854775807", -((1 << 63) - 1), None), ("9223372036854775808", 0, RANGE),
    ("-9223372036854775808", -(1 << 63), None), ("9223372036854775809", 0, RANGE),
    ("-9223372036854775809", 0, RANGE),
    ("-0x_1_2_3_4_5", -0x12345, None), ("0x_1_2_3_4_5", 0x12345, None), ("-_0x12345", 0, SYNTAX),
    ("_-0x12345", 0, SYNTAX), ("_0x12345", 0, SYNTAX), ("0x__12345", 0, SYNTAX), ("0x1__2345", 0, SYNTAX),
    ("0x1234__5", 0, SYNTAX), ("0x12345_", 0, SYNTAX),
    ("-0_1_2_3_4_5", -0o12345, None), ("0_1_2_3_4_5", 0o12345, None), ("-_012345", 0, SYNTAX),
    ("_-012345", 0, SYNTAX), ("_012345", 0, SYNTAX), ("0__12345", 0, SYNTAX), ("01234__5", 0, SYNTAX),
    ("012345_", 0, SYNTAX),
    ("+0xf", 0xF, None), ("-0xf", -0xF, None), ("0x+f", 0, SYNTAX), ("0x-f", 0, SYNTAX),
    # parseUint64BaseTests' base 0 rows that hold for a signed int too (decimal underscores, 0b, 0o)
    ("1_2_3_4_5", 12345, None), ("_12345", 0, SYNTAX), ("1__2345", 0, SYNTAX), ("12345_", 0, SYNTAX),
    ("0b101", 5, None), ("0B101", 5, None), ("0o377", 255, None), ("0O377", 255, None), ("0b", 0, SYNTAX),
    ("0o", 0, SYNTAX), ("0x", 0, SYNTAX), ("0b_1_0_1", 5, None), ("0b1__01", 0, SYNTAX), ("0b101_", 0, SYNTAX),
    ("0o_1_2_3_4_5", 0o12345, None), ("0o1234__5", 0, SYNTAX), ("123%45", 0, SYNTAX),
    # the reviewer's: Go refuses Unicode digits (Arabic-Indic, fullwidth)
    ("\u0661\u0662", 0, SYNTAX), ("\uff11", 0, SYNTAX),
]

# strconv.ParseUint(s, 0, 64): parseUint64BaseTests, base 0 rows.
PARSE_UINT_BASE0 = [
    ("", 0, SYNTAX), ("0", 0, None), ("0x", 0, SYNTAX), ("0X", 0, SYNTAX), ("1", 1, None), ("12345", 12345, None),
    ("012345", 0o12345, None), ("0x12345", 0x12345, None), ("0X12345", 0x12345, None), ("12345x", 0, SYNTAX),
    ("0xabcdefg123", 0, SYNTAX), ("123456789abc", 0, SYNTAX), ("98765432100", 98765432100, None),
    ("18446744073709551615", (1 << 64) - 1, None), ("18446744073709551616", 0, RANGE),
    ("18446744073709551620", 0, RANGE), ("0xFFFFFFFFFFFFFFFF", (1 << 64) - 1, None),
    ("0x10000000000000000", 0, RANGE), ("01777777777777777777777", (1 << 64) - 1, None),
    ("01777777777777777777778", 0, SYNTAX), ("02000000000000000000000", 0, RANGE),
    ("0200000000000000000000", 1 << 61, None), ("0b", 0, SYNTAX), ("0B", 0, SYNTAX), ("0b101", 5, None),
    ("0B101", 5, None), ("0o", 0, SYNTAX), ("0O", 0, SYNTAX), ("0o377", 255, None), ("0O377", 255, None),
    ("1_2_3_4_5", 12345, None), ("_12345", 0, SYNTAX), ("1__2345", 0, SYNTAX), ("12345_", 0, SYNTAX),
    ("0x_1_2_3_4_5", 0x12345, None), ("_0x12345", 0, SYNTAX), ("0x__12345", 0, SYNTAX), ("0x1__2345", 0, SYNTAX),
    ("0x1234__5", 0, SYNTAX), ("0x12345_", 0, SYNTAX),
    ("0_1_2_3_4_5", 0o12345, None), ("_012345", 0, SYNTAX), ("0__12345", 0, SYNTAX), ("01234__5", 0, SYNTAX),
    ("012345_", 0, SYNTAX),
    ("0o_1_2_3_4_5", 0o12345, None), ("_0o12345", 0, SYNTAX), ("0o__12345", 0, SYNTAX), ("0o1234__5", 0, SYNTAX),
    ("0o12345_", 0, SYNTAX),
    ("0b_1_0_1", 5, None), ("_0b101", 0, SYNTAX), ("0b__101", 0, SYNTAX), ("0b1__01", 0, SYNTAX),
    ("0b10__1", 0, SYNTAX), ("0b101_", 0, SYNTAX),
    # parseUint64Tests: no sign at all
    ("-0", 0, SYNTAX), ("-1", 0, SYNTAX), ("+1", 0, SYNTAX),
]

_LONG_TWOS = "2" * 4000
_ZEROS = "0" * 10000
# strconv.ParseFloat(s, 64): atoftests, as (in, FormatFloat(out, 'g', -1, 64), err).
PARSE_FLOAT = [
    ("", "0", SYNTAX), ("1", "1", None), ("+1", "1", None), ("1x", "0", SYNTAX), ("1.1.", "0", SYNTAX),
    ("1e23", "1e+23", None), ("1E23", "1e+23", None), ("100000000000000000000000", "1e+23", None),
    ("1e-100", "1e-100", None), ("123456700", "1.234567e+08", None),
    ("99999999999999974834176", "9.999999999999997e+22", None),
    ("100000000000000000000001", "1.0000000000000001e+23", None),
    ("100000000000000008388608", "1.0000000000000001e+23", None),
    ("100000000000000016777215", "1.0000000000000001e+23", None),
    ("100000000000000016777216", "1.0000000000000003e+23", None),
    ("-1", "-1", None), ("-0.1", "-0.1", None), ("-0", "-0", None), ("1e-20", "1e-20", None),
    ("625e-3", "0.625", None),
    # hexadecimal
    ("0x1p0", "1", None), ("0x1p1", "2", None), ("0x1p-1", "0.5", None), ("0x1ep-1", "15", None),
    ("-0x1ep-1", "-15", None), ("-0x1_ep-1", "-15", None), ("0x1p-200", "6.223015277861142e-61", None),
    ("0x1p200", "1.6069380442589903e+60", None), ("0x1fFe2.p0", "131042", None), ("0x1fFe2.P0", "131042", None),
    ("-0x2p3", "-16", None), ("0x0.fp4", "15", None), ("0x0.fp0", "0.9375", None), ("0x1e2", "0", SYNTAX),
    ("1p2", "0", SYNTAX),
    # zeros
    ("0", "0", None), ("0e0", "0", None), ("-0e0", "-0", None), ("+0e0", "0", None), ("0e-0", "0", None),
    ("-0e-0", "-0", None), ("+0e-0", "0", None), ("0e+0", "0", None), ("-0e+0", "-0", None), ("+0e+0", "0", None),
    ("0e+01234567890123456789", "0", None), ("0.00e-01234567890123456789", "0", None),
    ("-0e+01234567890123456789", "-0", None), ("-0.00e-01234567890123456789", "-0", None),
    ("0x0p+01234567890123456789", "0", None), ("0x0.00p-01234567890123456789", "0", None),
    ("-0x0p+01234567890123456789", "-0", None), ("-0x0.00p-01234567890123456789", "-0", None),
    ("0e291", "0", None), ("0e292", "0", None), ("0e347", "0", None), ("0e348", "0", None), ("-0e291", "-0", None),
    ("-0e292", "-0", None), ("-0e347", "-0", None), ("-0e348", "-0", None), ("0x0p126", "0", None),
    ("0x0p127", "0", None), ("0x0p128", "0", None), ("0x0p129", "0", None), ("0x0p130", "0", None),
    ("0x0p1022", "0", None), ("0x0p1023", "0", None), ("0x0p1024", "0", None), ("0x0p1025", "0", None),
    ("0x0p1026", "0", None), ("-0x0p126", "-0", None), ("-0x0p127", "-0", None), ("-0x0p128", "-0", None),
    ("-0x0p129", "-0", None), ("-0x0p130", "-0", None), ("-0x0p1022", "-0", None), ("-0x0p1023", "-0", None),
    ("-0x0p1024", "-0", None), ("-0x0p1025", "-0", None), ("-0x0p1026", "-0", None),
    # NaNs and Infs
    ("nan", "NaN", None), ("NaN", "NaN", None), ("NAN", "NaN", None), ("inf", "+Inf", None), ("-Inf", "-Inf", None),
    ("+INF", "+Inf", None), ("-Infinity", "-Inf", None), ("+INFINITY", "+Inf", None), ("Infinity", "+Inf", None),
    # largest float64, then too large
    ("1.7976931348623157e308", "1.7976931348623157e+308", None),
    ("-1.7976931348623157e308", "-1.7976931348623157e+308", None),
    ("0x1.fffffffffffffp1023", "1.7976931348623157e+308", None),
    ("-0x1.fffffffffffffp1023", "-1.7976931348623157e+308", None),
    ("0x1fffffffffffffp+971", "1.7976931348623157e+308", None),
    ("-0x1fffffffffffffp+971", "-1.7976931348623157e+308", None),
    ("0x.1fffffffffffffp1027", "1.7976931348623157e+308", None),
    ("-0x.1fffffffffffffp1027", "-1.7976931348623157e+308", None),
    ("1.7976931348623159e308", "+Inf", RANGE), ("-1.7976931348623159e308", "-Inf", RANGE),
    ("0x1p1024", "+Inf", RANGE), ("-0x1p1024", "-Inf", RANGE), ("0x2p1023", "+Inf", RANGE),
    ("-0x2p1023", "-Inf", RANGE), ("0x.1p1028", "+Inf", RANGE), ("-0x.1p1028", "-Inf", RANGE),
    ("0x.2p1027", "+Inf", RANGE), ("-0x.2p1027", "-Inf", RANGE),
    ("1.7976931348623158e308", "1.7976931348623157e+308", None),
    ("-1.7976931348623158e308", "-1.7976931348623157e+308", None),
    ("0x1.fffffffffffff7fffp1023", "1.7976931348623157e+308", None),
    ("-0x1.fffffffffffff7fffp1023", "-1.7976931348623157e+308", None),
    ("1.797693134862315808e308", "+Inf", RANGE), ("-1.797693134862315808e308", "-Inf", RANGE),
    ("0x1.fffffffffffff8p1023", "+Inf", RANGE), ("-0x1.fffffffffffff8p1023", "-Inf", RANGE),
    ("0x1fffffffffffff.8p+971", "+Inf", RANGE), ("-0x1fffffffffffff8p+967", "-Inf", RANGE),
    ("0x.1fffffffffffff8p1027", "+Inf", RANGE), ("-0x.1fffffffffffff9p1027", "-Inf", RANGE),
    ("1e308", "1e+308", None), ("2e308", "+Inf", RANGE), ("1e309", "+Inf", RANGE), ("0x1p1025", "+Inf", RANGE),
    ("1e310", "+Inf", RANGE), ("-1e310", "-Inf", RANGE), ("1e400", "+Inf", RANGE), ("-1e400", "-Inf", RANGE),
    ("1e400000", "+Inf", RANGE), ("-1e400000", "-Inf", RANGE), ("0x1p1030", "+Inf", RANGE),
    ("0x1p2000", "+Inf", RANGE), ("0x1p2000000000", "+Inf", RANGE), ("-0x1p1030", "-Inf", RANGE),
    ("-0x1p2000", "-Inf", RANGE), ("-0x1p2000000000", "-Inf", RANGE),
    # denormals, too small
    ("1e-305", "1e-305", None), ("1e-306", "1e-306", None), ("1e-307", "1e-307", None), ("1e-308", "1e-308", None),
    ("1e-309", "1e-309", None), ("1e-310", "1e-310", None), ("1e-322", "1e-322", None), ("5e-324", "5e-324", None),
    ("4e-324", "5e-324", None), ("3e-324", "5e-324", None), ("2e-324", "0", None), ("1e-350", "0", None),
    ("1e-400000", "0", None),
    ("0x2.00000000000000p-1010", "1.8227805048890994e-304", None),
    ("0x1.fffffffffffff0p-1010", "1.8227805048890992e-304", None),
    ("0x1.fffffffffffff7p-1010", "1.8227805048890992e-304", None),
    ("0x1.fffffffffffff8p-1010", "1.8227805048890994e-304", None),
    ("0x1.fffffffffffff9p-1010", "1.8227805048890994e-304", None),
    ("0x2.00000000000000p-1022", "4.450147717014403e-308", None),
    ("0x1.fffffffffffff0p-1022", "4.4501477170144023e-308", None),
    ("0x1.fffffffffffff7p-1022", "4.4501477170144023e-308", None),
    ("0x1.fffffffffffff8p-1022", "4.450147717014403e-308", None),
    ("0x1.fffffffffffff9p-1022", "4.450147717014403e-308", None),
    ("0x1.00000000000000p-1022", "2.2250738585072014e-308", None),
    ("0x0.fffffffffffff0p-1022", "2.225073858507201e-308", None),
    ("0x0.ffffffffffffe0p-1022", "2.2250738585072004e-308", None),
    ("0x0.ffffffffffffe7p-1022", "2.2250738585072004e-308", None),
    ("0x1.ffffffffffffe8p-1023", "2.225073858507201e-308", None),
    ("0x1.ffffffffffffe9p-1023", "2.225073858507201e-308", None),
    ("0x0.00000003fffff0p-1022", "2.072261e-317", None), ("0x0.00000003456780p-1022", "1.694649e-317", None),
    ("0x0.00000003456787p-1022", "1.694649e-317", None), ("0x0.00000003456788p-1022", "1.694649e-317", None),
    ("0x0.00000003456790p-1022", "1.6946496e-317", None), ("0x0.00000003456789p-1022", "1.6946496e-317", None),
    ("0x0.0000000345678800000000000000000000000001p-1022", "1.6946496e-317", None),
    ("0x0.000000000000f0p-1022", "7.4e-323", None), ("0x0.00000000000060p-1022", "3e-323", None),
    ("0x0.00000000000058p-1022", "3e-323", None), ("0x0.00000000000057p-1022", "2.5e-323", None),
    ("0x0.00000000000050p-1022", "2.5e-323", None), ("0x0.00000000000010p-1022", "5e-324", None),
    ("0x0.000000000000081p-1022", "5e-324", None), ("0x0.00000000000008p-1022", "0", None),
    ("0x0.00000000000007fp-1022", "0", None),
    # exponent overflow
    ("1e-4294967296", "0", None), ("1e+4294967296", "+Inf", RANGE), ("1e-18446744073709551616", "0", None),
    ("1e+18446744073709551616", "+Inf", RANGE), ("0x1p-4294967296", "0", None), ("0x1p+4294967296", "+Inf", RANGE),
    ("0x1p-18446744073709551616", "0", None), ("0x1p+18446744073709551616", "+Inf", RANGE),
    # parse errors
    ("1e", "0", SYNTAX), ("1e-", "0", SYNTAX), (".e-1", "0", SYNTAX), ("1\x00.2", "0", SYNTAX), ("0x", "0", SYNTAX),
    ("0x.", "0", SYNTAX), ("0x1", "0", SYNTAX), ("0x.1", "0", SYNTAX), ("0x1p", "0", SYNTAX), ("0x.1p", "0", SYNTAX),
    ("0x1p+", "0", SYNTAX), ("0x.1p+", "0", SYNTAX), ("0x1p-", "0", SYNTAX), ("0x.1p-", "0", SYNTAX),
    ("0x1p+2", "4", None), ("0x.1p+2", "0.25", None), ("0x1p-2", "0.25", None), ("0x.1p-2", "0.015625", None),
    ("2.2250738585072012e-308", "2.2250738585072014e-308", None),
    ("2.2250738585072011e-308", "2.225073858507201e-308", None),
    ("4.630813248087435e+307", "4.630813248087435e+307", None),
    ("22.222222222222222", "22.22222222222222", None), ("2." + _LONG_TWOS + "e+1", "22.22222222222222", None),
    ("0x1.1111111111111p222", "7.18931911124017e+66", None), ("0x2.2222222222222p221", "7.18931911124017e+66", None),
    ("0x2." + _LONG_TWOS + "p221", "7.18931911124017e+66", None),
    # halfway cases
    ("1.00000000000000011102230246251565404236316680908203125", "1", None), ("0x1.00000000000008p0", "1", None),
    ("1.00000000000000011102230246251565404236316680908203124", "1", None), ("0x1.00000000000007Fp0", "1", None),
    ("1.00000000000000011102230246251565404236316680908203126", "1.0000000000000002", None),
    ("0x1.000000000000081p0", "1.0000000000000002", None), ("0x1.00000000000009p0", "1.0000000000000002", None),
    ("1.00000000000000011102230246251565404236316680908203125" + _ZEROS + "1", "1.0000000000000002", None),
    ("0x1.00000000000008" + _ZEROS + "1p0", "1.0000000000000002", None),
    ("1.00000000000000033306690738754696212708950042724609375", "1.0000000000000004", None),
    ("0x1.00000000000018p0", "1.0000000000000004", None),
    # underscores
    ("1_23.50_0_0e+1_2", "1.235e+14", None), ("-_123.5e+12", "0", SYNTAX), ("+_123.5e+12", "0", SYNTAX),
    ("_123.5e+12", "0", SYNTAX), ("1__23.5e+12", "0", SYNTAX), ("123_.5e+12", "0", SYNTAX),
    ("123._5e+12", "0", SYNTAX), ("123.5_e+12", "0", SYNTAX), ("123.5__0e+12", "0", SYNTAX),
    ("123.5e_+12", "0", SYNTAX), ("123.5e+_12", "0", SYNTAX), ("123.5e_-12", "0", SYNTAX),
    ("123.5e-_12", "0", SYNTAX), ("123.5e+1__2", "0", SYNTAX), ("123.5e+12_", "0", SYNTAX),
    ("0x_1_2.3_4_5p+1_2", "74565", None), ("-_0x12.345p+12", "0", SYNTAX), ("+_0x12.345p+12", "0", SYNTAX),
    ("_0x12.345p+12", "0", SYNTAX), ("0x__12.345p+12", "0", SYNTAX), ("0x1__2.345p+12", "0", SYNTAX),
    ("0x12_.345p+12", "0", SYNTAX), ("0x12._345p+12", "0", SYNTAX), ("0x12.3__45p+12", "0", SYNTAX),
    ("0x12.345_p+12", "0", SYNTAX), ("0x12.345p_+12", "0", SYNTAX), ("0x12.345p+_12", "0", SYNTAX),
    ("0x12.345p_-12", "0", SYNTAX), ("0x12.345p-_12", "0", SYNTAX), ("0x12.345p+1__2", "0", SYNTAX),
    ("0x12.345p+12_", "0", SYNTAX),
    # the reviewer's: 1_000.5 is Go's, 0x1.8 (no p) and Unicode digits are not; +nan is not a special
    ("1_000.5", "1000.5", None), ("0x1.8", "0", SYNTAX), ("0x1.8p1", "3", None), ("\u0661.5", "0", SYNTAX),
    ("\uff11", "0", SYNTAX), ("+nan", "0", SYNTAX), ("infinit", "0", SYNTAX), ("infinityx", "0", SYNTAX),
]

# time.ParseDuration: parseDurationTests (all valid) ...
PARSE_DURATION = [
    ("0", 0), ("5s", 5 * S), ("30s", 30 * S), ("1478s", 1478 * S), ("-5s", -5 * S), ("+5s", 5 * S), ("-0", 0),
    ("+0", 0), ("5.0s", 5 * S), ("5.6s", 5 * S + 600 * MS), ("5.s", 5 * S), (".5s", 500 * MS), ("1.0s", S),
    ("1.00s", S), ("1.004s", S + 4 * MS), ("1.0040s", S + 4 * MS), ("100.00100s", 100 * S + MS), ("10ns", 10 * NS),
    ("11us", 11 * US), ("12µs", 12 * US), ("12μs", 12 * US), ("13ms", 13 * MS), ("14s", 14 * S), ("15m", 15 * M),
    ("16h", 16 * H), ("3h30m", 3 * H + 30 * M), ("10.5s4m", 4 * M + 10 * S + 500 * MS),
    ("-2m3.4s", -(2 * M + 3 * S + 400 * MS)), ("1h2m3s4ms5us6ns", H + 2 * M + 3 * S + 4 * MS + 5 * US + 6 * NS),
    ("39h9m14.425s", 39 * H + 9 * M + 14 * S + 425 * MS), ("52763797000ns", 52763797000),
    ("0.3333333333333333333h", 20 * M), ("9007199254740993ns", (1 << 53) + 1),
    ("9223372036854775807ns", (1 << 63) - 1), ("9223372036854775.807us", (1 << 63) - 1),
    ("9223372036s854ms775us807ns", (1 << 63) - 1), ("-9223372036854775808ns", -(1 << 63)),
    ("-9223372036854775.808us", -(1 << 63)), ("-9223372036s854ms775us808ns", -(1 << 63)),
    ("-2562047h47m16.854775808s", -(1 << 63)), ("0.100000000000000000000h", 6 * M),
    ("0.830103483285477580700h", 49 * M + 48 * S + 372539827),
]
# ... and parseDurationErrorTests, with the quoted input Go's message contains; then the reviewer's: one
# nanosecond below the minimum, a bare number, a unit of another language.
PARSE_DURATION_ERRORS = [
    ("", '""'), ("3", '"3"'), ("-", '"-"'), ("s", '"s"'), (".", '"."'), ("-.", '"-."'), (".s", '".s"'),
    ("+.s", '"+.s"'), ("1d", '"1d"'), ("\udc85\udc85", '"\\x85\\x85"'), ("\udcffff", '"\\xffff"'),
    ("hello \udcffff world", '"hello \\xffff world"'), ("\ufffd", '"\\xef\\xbf\\xbd"'),
    ("\ufffd hello \ufffd world", '"\\xef\\xbf\\xbd hello \\xef\\xbf\\xbd world"'),
    ("9223372036854775810ns", '"9223372036854775810ns"'), ("9223372036854775808ns", '"9223372036854775808ns"'),
    ("-9223372036854775809ns", '"-9223372036854775809ns"'), ("9223372036854776us", '"9223372036854776us"'),
    ("3000000h", '"3000000h"'), ("9223372036854775.808us", '"9223372036854775.808us"'),
    ("9223372036854ms775us808ns", '"9223372036854ms775us808ns"'),
    ("-2562047h47m16.854775809s", '"-2562047h47m16.854775809s"'), ("10", '"10"'), ("\u0661s", '"\\xd9\\xa1s"'),
]

# time.Duration.String: durationTests (and each positive one negated).
DURATION_STRINGS = [
    ("0s", 0), ("1ns", 1), ("1.1µs", 1100), ("2.2ms", 2200 * US), ("3.3s", 3300 * MS), ("4m5s", 4 * M + 5 * S),
    ("4m5.001s", 4 * M + 5001 * MS), ("5h6m7.001s", 5 * H + 6 * M + 7001 * MS), ("8m0.000000001s", 8 * M + 1),
    ("2562047h47m16.854775807s", (1 << 63) - 1), ("-2562047h47m16.854775808s", -(1 << 63)),
]

# strconv.Quote: quotetests.
QUOTES = [
    ("\a\b\f\r\n\t\v", '"\\a\\b\\f\\r\\n\\t\\v"'), ("\\", '"\\\\"'), ("abc\udcffdef", '"abc\\xffdef"'),
    ("\u263a", '"☺"'), ("\U0010ffff", '"\\U0010ffff"'), ("\x04", '"\\x04"'),
    ("!\u00a0!\u2000!\u3000!", '"!\\u00a0!\\u2000!\\u3000!"'), ("\x7f", '"\\x7f"'),
]


def _flag_set() -> goflag.FlagSet:
    flags = goflag.FlagSet("test")
    for kind in (goflag.INT, goflag.INT64, goflag.UINT, goflag.UINT64, goflag.FLOAT64, goflag.DURATION,
                 goflag.BOOL):
        flags.add(kind.name, kind, None, "")
    return flags


def _through_flag(kind: str, text: str) -> object:
    return _flag_set().parse([f"-{kind}={text}"]).values[kind]


def _flag_error(kind: str, text: str) -> str:
    with pytest.raises(goflag.GoFlagError) as refused:
        _flag_set().parse([f"-{kind}={text}"])
    return str(refused.value)


def _flag_message(kind: str, text: str, err: str) -> str:
    """What Go's flag package says of a strconv error (numError)."""
    reason = "value out of range" if err == RANGE else "parse error"  # flag.errRange, flag.errParse
    return f"invalid value {goflag.go_quote(text)} for flag -{kind}: {reason}"


@pytest.mark.parametrize(("text", "value", "err"), PARSE_INT_BASE0)
def test_int_flags_parse_as_go_parse_int_base_0(text: str, value: int, err: str | None) -> None:
    for kind in ("int", "int64"):
        if err is None:
            assert _through_flag(kind, text) == value
        else:
            assert _flag_error(kind, text) == _flag_message(kind, text, err)


@pytest.mark.parametrize(("text", "value", "err"), PARSE_INT_BASE0)
def test_parse_int_returns_gos_value_or_its_num_error(text: str, value: int, err: str | None) -> None:
    if err is None:
        assert goflag.parse_int(text) == value
        return
    with pytest.raises(goflag.NumError) as refused:
        goflag.parse_int(text)
    assert str(refused.value) == f"strconv.ParseInt: parsing {goflag.go_quote(text)}: {err}"


@pytest.mark.parametrize(("text", "value", "err"), PARSE_UINT_BASE0)
def test_uint_flags_parse_as_go_parse_uint_base_0(text: str, value: int, err: str | None) -> None:
    for kind in ("uint", "uint64"):
        if err is None:
            assert _through_flag(kind, text) == value
        else:
            assert _flag_error(kind, text) == _flag_message(kind, text, err)


@pytest.mark.parametrize(("text", "value", "err"), PARSE_UINT_BASE0)
def test_parse_uint_returns_gos_value_or_its_num_error(text: str, value: int, err: str | None) -> None:
    if err is None:
        assert goflag.parse_uint(text) == value
        return
    with pytest.raises(goflag.NumError) as refused:
        goflag.parse_uint(text)
    assert str(refused.value) == f"strconv.ParseUint: parsing {goflag.go_quote(text)}: {err}"


def test_base_10_forbids_underscores_and_prefixes_as_klogs_level_reads_it() -> None:
    assert goflag.parse_int("-12345", 10, 32) == -12345 and goflag.parse_int("012345", 10) == 12345
    for text, err in (("1_2_3_4_5", SYNTAX), ("0x10", SYNTAX), ("2147483648", RANGE), ("-2147483649", RANGE)):
        with pytest.raises(goflag.NumError, match=err):
            goflag.parse_int(text, 10, 32)
    assert goflag.parse_int("-2147483648", 10, 32) == -(1 << 31)


def _same_float(value: float, expected: str) -> bool:
    return goflag.format_float(value) == expected


@pytest.mark.parametrize(("text", "out", "err"), PARSE_FLOAT, ids=lambda v: v[:40] if isinstance(v, str) else v)
def test_parse_float_returns_gos_value_or_its_num_error(text: str, out: str, err: str | None) -> None:
    if err is None:
        assert _same_float(goflag.parse_float(text), out)
        return
    with pytest.raises(goflag.NumError) as refused:
        goflag.parse_float(text)
    assert refused.value.err == err and str(refused.value).startswith("strconv.ParseFloat: parsing ")


@pytest.mark.parametrize(("text", "out", "err"), PARSE_FLOAT, ids=lambda v: v[:40] if isinstance(v, str) else v)
def test_float64_flags_parse_as_go_parse_float(text: str, out: str, err: str | None) -> None:
    if err is None:
        value = _through_flag("float64", text)
        assert isinstance(value, float)
        assert math.isnan(value) if out == "NaN" else (value == float(out)
                                                         and math.copysign(1, value) == math.copysign(1, float(out)))
    else:
        assert _flag_error("float64", text) == _flag_message("float64", text, err)


@pytest.mark.parametrize(("text", "nanoseconds"), PARSE_DURATION)
def test_duration_flags_parse_as_go_parse_duration(text: str, nanoseconds: int) -> None:
    assert _through_flag("duration", text) == nanoseconds / 1e9


@pytest.mark.parametrize(("text", "nanoseconds"), PARSE_DURATION)
def test_parse_duration_returns_gos_nanoseconds(text: str, nanoseconds: int) -> None:
    assert goflag.parse_duration_ns(text) == nanoseconds


@pytest.mark.parametrize(("text", "quoted"), PARSE_DURATION_ERRORS)
def test_a_bad_duration_flag_is_a_parse_error(text: str, quoted: str) -> None:
    assert _flag_error("duration", text) == f"invalid value {goflag.go_quote(text)} for flag -duration: parse error"


@pytest.mark.parametrize(("text", "quoted"), PARSE_DURATION_ERRORS)
def test_a_bad_duration_is_refused_with_gos_time_error(text: str, quoted: str) -> None:
    with pytest.raises(goflag.DurationError) as refused:
        goflag.parse_duration_ns(text)
    assert str(refused.value).startswith("time: ") and quoted in str(refused.value)


def test_duration_errors_name_what_is_wrong_as_go_does() -> None:
    for text, message in (("3", 'time: missing unit in duration "3"'),
                          ("1d", 'time: unknown unit "d" in duration "1d"'),
                          ("1e3s", 'time: unknown unit "e" in duration "1e3s"'), ("-.", 'time: invalid duration "-."')):
        with pytest.raises(goflag.DurationError) as refused:
            goflag.parse_duration_ns(text)
        assert str(refused.value) == message


@pytest.mark.parametrize(("text", "nanoseconds"), DURATION_STRINGS)
def test_durations_are_written_as_go_writes_them(text: str, nanoseconds: int) -> None:
    assert goflag.duration_string(nanoseconds) == text
    if nanoseconds > 0:
        assert goflag.duration_string(-nanoseconds) == "-" + text
    assert goflag.parse_duration_ns(text if text != "0s" else "0") == nanoseconds  # round trip (Go issue 48629)


@pytest.mark.parametrize(("text", "quoted"), QUOTES)
def test_values_in_messages_are_quoted_as_strconv_quote(text: str, quoted: str) -> None:
    assert goflag.go_quote(text) == quoted


def test_flag_errors_are_the_flag_packages_for_every_type() -> None:
    # flag_test.go TestParseError and TestRangeError
    for kind in ("int", "int64", "uint", "uint64", "float64", "duration"):
        assert _flag_error(kind, "x") == f'invalid value "x" for flag -{kind}: parse error'
    assert _flag_error("bool", "x") == 'invalid boolean value "x" for -bool: parse error'
    for kind in ("int", "int64", "uint", "uint64"):
        assert _flag_error(kind, "123456789012345678901").endswith(": value out of range")
    assert _flag_error("float64", "1e1000") == 'invalid value "1e1000" for flag -float64: value out of range'


# flag_test.go TestPrintDefaults (without its list and panicking Values: that output is Go's, line for line).
_PRINT_DEFAULTS = """Usage of print defaults test:
  -A\tfor bootstrapping, allow 'any' type
  -Alongflagname
    \tdisable bounds checking
  -C\ta boolean defaulting to true (default true)
  -D path
    \tset relative path for local imports
  -E string
    \tissue 23543 (default "0")
  -F number
    \ta non-zero number (default 2.7)
  -G float
    \ta float that defaults to zero
  -M string
    \ta multiline
    \thelp
    \tstring
  -N int
    \ta non-zero int (default 27)
  -O\ta flag
    \tmultiline help string (default true)
  -V list
    \ta list of strings (default [a b])
  -Z int
    \tan int that defaults to zero
  -maxT timeout
    \tset timeout for dial
"""


def test_usage_is_gos_print_defaults_form() -> None:
    flags = goflag.FlagSet("print defaults test")
    flags.add("A", goflag.BOOL, False, "for bootstrapping, allow 'any' type")
    flags.add("Alongflagname", goflag.BOOL, False, "disable bounds checking")
    flags.add("C", goflag.BOOL, True, "a boolean defaulting to true")
    flags.add("D", goflag.STRING, "", "set relative `path` for local imports")
    flags.add("E", goflag.STRING, "0", "issue 23543")
    flags.add("F", goflag.FLOAT64, 2.7, "a non-zero `number`")
    flags.add("G", goflag.FLOAT64, 0.0, "a float that defaults to zero")
    flags.add("M", goflag.STRING, "", "a multiline\nhelp\nstring")
    flags.add("N", goflag.INT, 27, "a non-zero int")
    flags.add("O", goflag.BOOL, True, "a flag\nmultiline help string")
    list_kind = goflag.Kind("flagVar", str, show=lambda value: "[" + " ".join(value) + "]", zero="[]")  # type: ignore[arg-type]
    flags.add("V", list_kind, ("a", "b"), "a `list` of strings")
    flags.add("Z", goflag.INT, 0, "an int that defaults to zero")
    flags.add("maxT", goflag.DURATION, 0.0, "set `timeout` for dial")
    assert flags.usage() == _PRINT_DEFAULTS


def test_defaults_are_written_as_their_go_values() -> None:
    flags = goflag.FlagSet("koordlet")
    flags.add("qps", goflag.FLOAT64, 20.0, "q")
    flags.add("big", goflag.FLOAT64, 1e21, "b")
    flags.add("interval", goflag.DURATION, 86400.0, "i")
    flags.add("short", goflag.DURATION, 0.5, "s")
    flags.add("level", goflag.value_kind("Level", int, zero="0"), 0, "l")
    text = flags.usage()
    assert "-qps float\n    \tq (default 20)\n" in text and "(default 1e+21)" in text
    assert "-interval duration\n    \ti (default 24h0m0s)\n" in text and "(default 500ms)" in text
    assert "-level value\n    \tl\n" in text  # a Value of its own is a "value"; its zero default is not shown


@pytest.mark.parametrize(("value", "text"), [
    (0.0, "0"), (-0.0, "-0"), (1.0, "1"), (2.7, "2.7"), (100000.0, "100000"), (1e6, "1e+06"), (123456.7, "123456.7"),
    (1234567.0, "1.234567e+06"), (0.0001, "0.0001"), (0.00001, "1e-05"), (math.inf, "+Inf"), (math.nan, "NaN"),
])
def test_floats_are_written_as_go_formats_g_with_the_shortest_digits(value: float, text: str) -> None:
    assert goflag.format_float(value) == text
