"""What the generated C needs on AVR (8-bit, no FPU, constants in flash):
the libm functions avr-libc lacks, and weights packed losslessly into 3.5
bytes a float for a chip short of flash (the Uno). The flash-read macros
(``PROGMEM``, ``pgm_read_*``) are written by ``c_codegen``'s file template
under ``#if defined(__AVR__)``.
"""
from __future__ import annotations

import numpy as np

# libm functions avr-libc 2.0 lacks: a definition each, compiled on AVR only
_AVR_LIBM_GAPS = {
    "log1pf": """static float avr_log1pf(float x)
{
  const float u = 1.0f + x;  /* Goldberg's correction for the rounding of 1 + x */
  return u == 1.0f ? x : logf(u) * (x / (u - 1.0f));
}""",
    "nearbyintf": """static float avr_nearbyintf(float x)
{
  const float f = floorf(x), d = x - f;  /* exact; half to even, as ONNX's Round */
  return d > 0.5f || (d == 0.5f && fmodf(f, 2.0f) != 0.0f) ? f + 1.0f : f;
}""",
    "erff": """static float avr_erff(float x)
{
  /* Abramowitz and Stegun 7.1.26, |error| <= 1.5e-7 */
  const float a = fabsf(x), t = 1.0f / (1.0f + 0.3275911f * a);
  const float p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
                  t * (-1.453152027f + t * 1.061405429f))));
  const float y = 1.0f - p * expf(-a * a);
  return x < 0.0f ? -y : y;
}""",
}


def _packed(flat: np.ndarray):
    """A float32 array stored losslessly in 3.5 bytes a value: the three low
    bytes of each (mantissa and the exponent's lowest bit), and a 4-bit index
    into a table of the distinct top bytes (sign and the exponent's high
    seven bits), which trained weights spread over a few binades share. None
    where that does not apply: more than 16 top bytes, an array too small for
    the table to pay, or one too large for 16-bit flash offsets (AVR)."""
    n = flat.size
    bits = np.ascontiguousarray(flat, np.float32).view(np.uint32)
    top = (bits >> 24).astype(np.uint8)
    table, index = np.unique(top, return_inverse=True)
    if len(table) > 16 or n < 256 or 3 * n >= 1 << 16:
        return None
    low = np.stack([(bits >> s) & 0xFF for s in (0, 8, 16)], axis=1).astype(np.uint8).reshape(-1)
    index = np.append(index.astype(np.uint8), 0)[:n + n % 2]
    nibbles = (index[0::2] | (index[1::2] << 4)).astype(np.uint8)
    return low, nibbles, np.pad(table, (0, 16 - len(table))).astype(np.uint8)


def libm_gaps(libm: list[str]) -> str:
    """Definitions of the libm functions in ``libm`` that avr-libc lacks."""
    return "".join(f"/* not in avr-libc */\n{_AVR_LIBM_GAPS[f]}\n#define {f} avr_{f}\n"
                   for f in libm if f in _AVR_LIBM_GAPS)


def unpack_function(name: str, rom: str) -> str:
    """C of ``<name>_unpack`` and the ``<ROM>_PACKED`` read of a packed array."""
    return f"""
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "packed weights (grpo-ctrl firmware's pack) assume a little-endian target"
#endif
/* element i of a packed float array (the generator's _packed): lossless;
 * the bytes put together in memory order (8-bit AVR: no 32-bit shifts) */
static float {name}_unpack(const unsigned char *low, const unsigned char *top,
                           const unsigned char *tab, unsigned int i)
{{
  const unsigned char t = {rom}_U8(top, i >> 1);
  const unsigned char *p = low + 3u * i;
  union {{ unsigned char b[4]; float f; }} v;
  v.b[0] = {rom}_U8(p, 0);
  v.b[1] = {rom}_U8(p, 1);
  v.b[2] = {rom}_U8(p, 2);
  v.b[3] = {rom}_U8(tab, i & 1u ? t >> 4 : t & 15u);
  return v.f;
}}
#define {rom}_PACKED(a, i) {name}_unpack(a##_low, a##_top, a##_tab, (unsigned int)(i))
"""
