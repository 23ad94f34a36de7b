/*
 * pendsim: batched stepping, resets, sensors, RNG and branching.
 * The plants' equations live in plants.c.
 */
#include "pendsim.h"
#include "plant_layout.h"
#include "plants.h"

#include <math.h>
#include <string.h>

#include "exact_math.h" /* PI, angle_normalize, libm_sin_block */

/* ------------------------------------------------------------------------
 * Counter-based RNG: draw n of environment b is a hash of (key_b, n), so a
 * branch that copies (key, counter) replays the same noise exactly.
 * The finaliser is SplitMix64's (Steele, Lea and Flood 2014).
 * ---------------------------------------------------------------------- */
static uint64_t mix64(uint64_t z)
{
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static double rng_uniform(ps_data *d, int b)
{
  const uint64_t r = mix64(d->rng_key[b] ^ mix64(d->rng_ctr[b]++));
  return (double)(r >> 11) * 0x1.0p-53; /* [0, 1) */
}

static double rng_normal(ps_data *d, int b)
{
  const double u1 = 1.0 - rng_uniform(d, b); /* (0, 1] keeps log finite */
  const double u2 = rng_uniform(d, b);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * PI * u2);
}

void ps_seed(ps_data *d, const uint64_t *seed)
{
  for (int b = 0; b < d->B; ++b) {
    d->rng_key[b] = mix64(seed[b] + 0x9E3779B97F4A7C15ULL);
    d->rng_ctr[b] = 0;
  }
}

/* sin and cos of x for float32 observations, written so that the compiler
 * vectorises a loop of them: Cody-Waite reduction by pi/2 and fdlibm's
 * kernel polynomials on [-pi/4, pi/4]. Error about 1e-16 for |x| <=
 * FAST_SINCOS_MAX, far below float32's resolution, so observations round as
 * with libm except in rare ties (then by one float32 ulp). Beyond it (where
 * k * pio2_1 is no longer exact) and for NaN the values are wrong but
 * defined: callers take libm's there (sincos_any, fix_far_angles). */
#define FAST_SINCOS_MAX 1e5
static inline void fast_sincos(double x, double *s_out, double *c_out)
{
  const double two_over_pi = 6.36619772367581382433e-01;
  const double pio2_1 = 1.57079632673412561417e+00;  /* first 33 bits of pi/2 */
  const double pio2_2 = 6.07710050630396597660e-11;  /* next 33 bits */
  const double pio2_3 = 2.02226624879595063154e-21;  /* the rest */
  const double round_magic = 6755399441055744.0;      /* 1.5 * 2^52 */
  const double k_magic = x * two_over_pi + round_magic; /* k in the low mantissa bits */
  const double k = k_magic - round_magic;
  const double r = ((x - k * pio2_1) - k * pio2_2) - k * pio2_3;
  const double z = r * r;
  const double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03,
               S3 = -1.98412698298579493134e-04, S4 = 2.75573137070700676789e-06,
               S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;
  const double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03,
               C3 = 2.48015872894767294178e-05, C4 = -2.75573143513906633035e-07,
               C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;
  const double sr = r + r * z * (S1 + z * (S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)))));
  const double cr = 1.0 - 0.5 * z + z * z * (C1 + z * (C2 + z * (C3 + z * (C4 + z * (C5 + z * C6)))));
  /* k mod 4 from the mantissa's low bits (two's complement for k < 0, exact
   * for |k| < 2^51); a cast of k to int would overflow for large |x| */
  uint64_t k_bits;
  memcpy(&k_bits, &k_magic, sizeof k_bits);
  const int odd = (int)(k_bits & 1u), neg = (int)(k_bits & 2u);
  const double s = odd ? cr : sr, c = odd ? -sr : cr;
  *s_out = neg ? -s : s;
  *c_out = neg ? -c : c;
}

/* ------------------------------------------------------------------------
 * Per-environment helpers.
 * ---------------------------------------------------------------------- */
static void load(const ps_model *m, const ps_data *d, int b, double *x, double *p)
{
  const int B = d->B;
  for (int k = 0; k < m->nx; ++k) x[k] = d->x[k * B + b];
  for (int k = 0; k < m->nparam; ++k) p[k] = d->param[k * B + b];
}

static void clip_velocities(const ps_model *m, double *x)
{
  if (m->v_max <= 0) return;
  for (int k = 0; k < m->nx; ++k) {
    if (plant_is_angular_velocity(m->system, k)) {
      if (x[k] > m->v_max) x[k] = m->v_max;
      else if (x[k] < -m->v_max) x[k] = -m->v_max;
    }
  }
}

static void integrate(const ps_model *m, const double *p, double *x, double u)
{
  const int nx = m->nx, nq = nx / 2;
  const double h = m->dt / m->substeps;
  double k1[PS_MAX_NX], k2[PS_MAX_NX], k3[PS_MAX_NX], k4[PS_MAX_NX], y[PS_MAX_NX];
  for (int s = 0; s < m->substeps; ++s) {
    plant_dynamics(m, p, x, u, k1);
    switch (m->integrator) {
    case PS_EULER:
      for (int k = 0; k < nx; ++k) x[k] = x[k] + h * k1[k];
      break;
    case PS_SEMI_EULER:
      for (int k = nq; k < nx; ++k) x[k] = x[k] + k1[k] * h;
      clip_velocities(m, x);
      for (int k = 0; k < nq; ++k) x[k] = x[k] + x[nq + k] * h;
      break;
    default: /* PS_RK4 */
      for (int k = 0; k < nx; ++k) y[k] = x[k] + 0.5 * h * k1[k];
      plant_dynamics(m, p, y, u, k2);
      for (int k = 0; k < nx; ++k) y[k] = x[k] + 0.5 * h * k2[k];
      plant_dynamics(m, p, y, u, k3);
      for (int k = 0; k < nx; ++k) y[k] = x[k] + h * k3[k];
      plant_dynamics(m, p, y, u, k4);
      for (int k = 0; k < nx; ++k)
        x[k] = x[k] + h / 6.0 * (k1[k] + 2.0 * k2[k] + 2.0 * k3[k] + k4[k]);
      break;
    }
    clip_velocities(m, x);
  }
}

static double quadratic_cost(const ps_model *m, const double *x, double u)
{
  double cost = 0.0;
  for (int k = 0; k < m->nx; ++k) {
    if (m->w_x[k] == 0.0) continue;
    const double e = plant_is_angle(m->system, k) ? angle_normalize(x[k]) : x[k];
    cost += m->w_x[k] * (e * e);
  }
  return cost + m->w_u * (u * u);
}

/* The reward of a step from state x under command u (before the step). */
static double step_reward(const ps_model *m, const double *p, const double *x, double u)
{
  switch (m->reward_kind) {
  case PS_REWARD_ALIVE: return 1.0;
  case PS_REWARD_HEIGHT: {
    const double h = plant_height(m, p, x);
    return -quadratic_cost(m, x, u) - m->w_height * (1.0 - h) -
           (h < m->up_height ? m->w_down : 0.0) -
           m->w_power * fabs(u * plant_driven_velocity(m, x));
  }
  default: return -quadratic_cost(m, x, u);
  }
}

/* fast_sincos where it is accurate, else libm (one angle at a time). */
static inline void sincos_any(double x, double *s_out, double *c_out)
{
  if (fabs(x) <= FAST_SINCOS_MAX) {
    fast_sincos(x, s_out, c_out);
  } else {
    *s_out = sin(x);
    *c_out = cos(x);
  }
}

/* Observation of one state. Angles enter as (cos, sin), computed by
 * fast_sincos: the observation is float32, so libm's last bits are moot. */
static inline void observation(int system, const double *x, float *obs)
{
  double c0, s0, c1, s1;
  switch (system) {
  case PS_PENDULUM:
    sincos_any(x[0], &s0, &c0);
    obs[0] = (float)c0;
    obs[1] = (float)s0;
    obs[2] = (float)x[1];
    break;
  case PS_CARTPOLE:
    sincos_any(x[2], &s0, &c0);
    obs[0] = (float)x[0];
    obs[1] = (float)x[1];
    obs[2] = (float)c0;
    obs[3] = (float)s0;
    obs[4] = (float)x[3];
    break;
  default:
    sincos_any(x[0], &s0, &c0);
    sincos_any(x[1], &s1, &c1);
    obs[0] = (float)c0;
    obs[1] = (float)s0;
    obs[2] = (float)c1;
    obs[3] = (float)s1;
    obs[4] = (float)x[2];
    obs[5] = (float)x[3];
    break;
  }
}

static int has_sensor_model(const ps_model *m)
{
  for (int k = 0; k < m->nx; ++k)
    if (m->noise_std[k] > 0 || m->enc_counts[k] > 0) return 1;
  return 0;
}

/* What environment b's sensors report: the true state plus its offset,
 * with Gaussian noise (from the environment's RNG), then encoder
 * quantisation. */
static void observe_env(const ps_model *m, ps_data *d, int b, float *obs)
{
  double x[PS_MAX_NX];
  const int nq = m->plant_mode != PS_PLANT_NOMINAL ? m->nx / 2 : 0;
  for (int k = 0; k < m->nx; ++k) {
    x[k] = d->x[k * d->B + b];
    if (k < nq) x[k] += d->offset[k * d->B + b];
    if (m->noise_std[k] > 0) x[k] += m->noise_std[k] * rng_normal(d, b);
    if (m->enc_counts[k] > 0) {
      const double q = 2 * PI / m->enc_counts[k];
      x[k] = q * floor(x[k] / q + 0.5);
    }
  }
  observation(m->system, x, obs);
}

/* Observations of all environments without a sensor model: one plain loop
 * per plant over the state arrays, which the compiler vectorises (the
 * pendulum's; the others' strided stores defeat it). */
static inline __attribute__((always_inline)) void
observe_all_exact(int system, int B, const double *restrict xs, float *restrict obs)
{
  double c0, s0, c1, s1;
  if (system == PS_PENDULUM) {
    for (int b = 0; b < B; ++b) {
      fast_sincos(xs[b], &s0, &c0);
      obs[3 * b] = (float)c0;
      obs[3 * b + 1] = (float)s0;
      obs[3 * b + 2] = (float)xs[B + b];
    }
  } else if (system == PS_CARTPOLE) {
    for (int b = 0; b < B; ++b) {
      fast_sincos(xs[2 * B + b], &s0, &c0);
      obs[5 * b] = (float)xs[b];
      obs[5 * b + 1] = (float)xs[B + b];
      obs[5 * b + 2] = (float)c0;
      obs[5 * b + 3] = (float)s0;
      obs[5 * b + 4] = (float)xs[3 * B + b];
    }
  } else {
    for (int b = 0; b < B; ++b) {
      fast_sincos(xs[b], &s0, &c0);
      fast_sincos(xs[B + b], &s1, &c1);
      obs[6 * b] = (float)c0;
      obs[6 * b + 1] = (float)s0;
      obs[6 * b + 2] = (float)c1;
      obs[6 * b + 3] = (float)s1;
      obs[6 * b + 4] = (float)xs[2 * B + b];
      obs[6 * b + 5] = (float)xs[3 * B + b];
    }
  }
}

/* The same loop compiled for wider vector units, chosen at run time.
 * (GCC 12's target_clones leaves this loop scalar; target attributes don't.) */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target("avx2"))) static void
observe_all_exact_avx2(int system, int B, const double *restrict xs, float *restrict obs)
{
  observe_all_exact(system, B, xs, obs);
}
#define OBSERVE_ALL_EXACT(system, B, xs, obs)                                   \
  (__builtin_cpu_supports("avx2") ? observe_all_exact_avx2(system, B, xs, obs) \
                                  : observe_all_exact(system, B, xs, obs))
#else
#define OBSERVE_ALL_EXACT observe_all_exact
#endif

/* After the vectorised loop: the (cos, sin) of angles beyond FAST_SINCOS_MAX
 * (or NaN) from libm. A second pass keeps the loop above free of branches. */
static void fix_far_angles(const ps_model *m, int B, const double *xs, float *obs)
{
  /* per plant: state index of each angle and where its cos sits in obs */
  static const int ANGLE[PS_NUM_SYSTEMS][2] = {{0, -1}, {2, -1}, {0, 1}, {0, 1}};
  static const int COS_AT[PS_NUM_SYSTEMS][2] = {{0, -1}, {2, -1}, {0, 2}, {0, 2}};
  for (int j = 0; j < 2 && ANGLE[m->system][j] >= 0; ++j) {
    const double *x = xs + (size_t)ANGLE[m->system][j] * B;
    for (int b = 0; b < B; ++b) {
      if (fabs(x[b]) <= FAST_SINCOS_MAX) continue;
      float *o = obs + (size_t)b * m->nobs + COS_AT[m->system][j];
      o[0] = (float)cos(x[b]);
      o[1] = (float)sin(x[b]);
    }
  }
}

static void observe_all(const ps_model *m, ps_data *d, float *obs)
{
  if (has_sensor_model(m) || m->plant_mode != PS_PLANT_NOMINAL) {
    for (int b = 0; b < d->B; ++b) observe_env(m, d, b, obs + (size_t)b * m->nobs);
  } else {
    OBSERVE_ALL_EXACT(m->system, d->B, d->x, obs);
    fix_far_angles(m, d->B, d->x, obs);
  }
}

static double rng_between(ps_data *d, int b, double lo, double hi)
{
  return lo + (hi - lo) * rng_uniform(d, b);
}

/* Parameters a plant gained after its first release (the pendulum's com
 * and inertia) draw after everything else and only where their range is
 * not a point: a plant whose shape is fixed consumes the same random
 * numbers as before they existed, so every seed draws what it drew then. */
static int params_drawn_first(const ps_model *m)
{
  return m->system == PS_PENDULUM ? PS_PEND_COM : m->nparam;
}

/* A new plant for environment b from the model's ranges. Every quantity
 * (but the late parameters above) takes its draw even when its range is a
 * point, so that changing one range leaves the draws of all the others as
 * they were. */
static void draw_plant(const ps_model *m, ps_data *d, int b)
{
  const int B = d->B, first = params_drawn_first(m);
  const ps_plant_ranges *r = &m->ranges;
  for (int k = 0; k < first; ++k)
    d->param[k * B + b] = rng_between(d, b, r->param_lo[k], r->param_hi[k]);
  const int delay = r->delay_lo + (int)((r->delay_hi - r->delay_lo + 1) * rng_uniform(d, b));
  d->delay[b] = delay > r->delay_hi ? r->delay_hi : delay;
  d->motor_k[b] = rng_between(d, b, r->motor_k_lo, r->motor_k_hi);
  d->torque_noise[b] = rng_between(d, b, r->torque_noise_lo, r->torque_noise_hi);
  for (int k = 0; k < m->nx / 2; ++k)
    d->offset[k * B + b] = rng_between(d, b, r->offset_lo[k], r->offset_hi[k]);
  for (int k = first; k < m->nparam; ++k)
    d->param[k * B + b] = r->param_lo[k] == r->param_hi[k]
                              ? r->param_lo[k]
                              : rng_between(d, b, r->param_lo[k], r->param_hi[k]);
}

static void reset_env(const ps_model *m, ps_data *d, int b)
{
  const int B = d->B;
  if (m->plant_mode == PS_PLANT_NOMINAL) {
    for (int k = 0; k < m->nparam; ++k) d->param[k * B + b] = m->param[k];
  } else {
    if (m->plant_mode == PS_PLANT_DRAW) draw_plant(m, d, b);
    d->tau[b] = 0.0;
    d->push[b] = 0.0;
    d->push_left[b] = 0;
  }
  for (int k = 0; k < m->nx; ++k)
    d->x[k * B + b] = rng_between(d, b, m->x0_low[k], m->x0_high[k]);
  for (int i = 0; i < PS_MAX_DELAY; ++i) d->act_buf[i * B + b] = 0.0f;
  d->t[b] = 0;
}

/* ------------------------------------------------------------------------
 * Public API.
 * ---------------------------------------------------------------------- */
void ps_observe(const ps_model *m, ps_data *d, float *obs) { observe_all(m, d, obs); }

void ps_observation(int system, const double *x, float *obs) { observation(system, x, obs); }

void ps_reset(const ps_model *m, ps_data *d, const uint8_t *mask, float *obs)
{
  for (int b = 0; b < d->B; ++b) {
    if (mask && !mask[b]) continue;
    reset_env(m, d, b);
    if (obs) observe_env(m, d, b, obs + (size_t)b * m->nobs);
  }
}

static int all_finite(const float *a, size_t n)
{
  for (size_t i = 0; i < n; ++i)
    if (!isfinite(a[i])) return 0;
  return 1;
}

/* The command that reaches environment b's actuator now: the action from
 * `delay` steps ago (the new one joins the queue), saturated. */
static inline float actuator_command(const ps_model *m, ps_data *d, int b, float u, int delay)
{
  const int B = d->B;
  if (delay > 0) {
    float *buf = d->act_buf;
    const float oldest = buf[b];
    for (int i = 0; i + 1 < delay; ++i) buf[i * B + b] = buf[(i + 1) * B + b];
    buf[(delay - 1) * B + b] = u;
    u = oldest;
  }
  const float u_max = (float)m->u_max;
  return u > u_max ? u_max : (u < -u_max ? -u_max : u);
}

/* Environment b's actuation delay: the model's, or its own plant's (a
 * held one is the caller's: kept in bounds). */
static inline int env_delay(const ps_model *m, const ps_data *d, int b)
{
  if (m->plant_mode == PS_PLANT_NOMINAL) return m->delay;
  const int delay = d->delay[b];
  return delay < 0 ? 0 : (delay > PS_MAX_DELAY ? PS_MAX_DELAY : delay);
}

/* What drives environment b's plant when its command is u (plant modes
 * other than NOMINAL): the motor's first-order response to u, actuator
 * noise and any push (see ps_plant_ranges). */
static double actuator_input(const ps_model *m, ps_data *d, int b, double u)
{
  const ps_plant_ranges *r = &m->ranges;
  const double k = d->motor_k[b]; /* k = 1: u itself, not u to rounding */
  const double tau = k >= 1.0 ? u : d->tau[b] + k * (u - d->tau[b]);
  d->tau[b] = tau;
  double input = tau;
  if (d->torque_noise[b] > 0) input += d->torque_noise[b] * rng_normal(d, b);
  if (r->push_rate > 0) {
    if (d->push_left[b] == 0 && rng_uniform(d, b) < r->push_rate * m->dt) {
      const double magnitude = rng_between(d, b, r->push_lo, r->push_hi);
      d->push[b] = rng_uniform(d, b) < 0.5 ? -magnitude : magnitude;
      d->push_left[b] = r->push_steps;
    }
    if (d->push_left[b] > 0) {
      input += d->push[b];
      d->push_left[b]--;
    }
  }
  return input;
}

/* Termination, truncation and the step count of environment b after its
 * state became x; returns the reward adjustment for a terminating step. */
static inline double end_of_step(const ps_model *m, ps_data *d, int b, const double *x,
                                 uint8_t *terminated, uint8_t *truncated)
{
  int term = 0;
  for (int k = 0; k < m->nx; ++k)
    if (m->term_limit[k] > 0 && fabs(x[k]) > m->term_limit[k]) term = 1;
  const int t = ++d->t[b];
  terminated[b] = (uint8_t)term;
  truncated[b] = (uint8_t)(m->max_steps > 0 && t >= m->max_steps);
  return term ? m->term_reward : 0.0;
}

/* ------------------------------------------------------------------------
 * Gymnasium's pendulum, the hottest case: in chunks, each a few loops the
 * compiler vectorises (sin, angle, step) and two rare fix-ups.
 * ---------------------------------------------------------------------- */
enum { GYM_CHUNK = 256 };

/* Gymnasium's Pendulum-v1 step for n environments, term by term in the
 * precision NumPy 2 gives it: the float32 action meets Python floats and
 * stays float32, then meets the float64 state. The reward is the cost of
 * the pre-step state. u is the actuator command (saturated, delayed). */
static inline __attribute__((always_inline)) void
pendulum_gym_chunk(const ps_model *m, int n, double *restrict th, double *restrict thd,
                   const double *restrict g, const double *restrict mass,
                   const double *restrict l, const float *restrict u, int32_t *restrict t,
                   double *restrict reward, uint8_t *restrict terminated,
                   uint8_t *restrict truncated)
{
  double sin_th[GYM_CHUNK], an[GYM_CHUNK];
  uint8_t redo[GYM_CHUNK], far[GYM_CHUNK];
  libm_sin_block(n, th, sin_th, redo);
  for (int j = 0; j < n; ++j) an[j] = angle_normalize_near(th[j], &far[j]);
  for (int j = 0; j < n; ++j)
    if (far[j]) an[j] = angle_normalize(th[j]);
  const double dt = m->dt, v_max = m->v_max, w_thd = m->w_x[1], term_reward = m->term_reward;
  const double limit_th = m->term_limit[0], limit_thd = m->term_limit[1];
  const float w_u = (float)m->w_u;
  const int max_steps = m->max_steps;
  for (int j = 0; j < n; ++j) {
    /* NumPy's float32 u**2 goes through a vectorised pow that is sometimes
     * one ulp off u * u; that moves the reward by at most 5e-10 at |u| <= 2. */
    const float uj = u[j], u_sq = uj * uj;
    const double cost = an[j] * an[j] + w_thd * (thd[j] * thd[j]) + (double)(w_u * u_sq);
    const float torque_term = (float)(3.0 / (mass[j] * (l[j] * l[j]))) * uj;
    double newthd = thd[j] + (3 * g[j] / (2 * l[j]) * sin_th[j] + (double)torque_term) * dt;
    newthd = newthd > v_max ? v_max : newthd;
    newthd = newthd < -v_max ? -v_max : newthd;
    const double newth = th[j] + newthd * dt;
    th[j] = newth;
    thd[j] = newthd;
    const int term = (limit_th > 0 && fabs(newth) > limit_th) |
                     (limit_thd > 0 && fabs(newthd) > limit_thd);
    const int32_t steps = t[j] + 1;
    t[j] = steps;
    terminated[j] = (uint8_t)term;
    truncated[j] = (uint8_t)(max_steps > 0 && steps >= max_steps);
    reward[j] = -cost + (term ? term_reward : 0.0);
  }
}

static void pendulum_gym_chunk_base(const ps_model *m, int n, double *restrict th,
                                    double *restrict thd, const double *restrict g,
                                    const double *restrict mass, const double *restrict l,
                                    const float *restrict u, int32_t *restrict t,
                                    double *restrict reward, uint8_t *restrict terminated,
                                    uint8_t *restrict truncated)
{
  pendulum_gym_chunk(m, n, th, thd, g, mass, l, u, t, reward, terminated, truncated);
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
/* The same, compiled for AVX2 and FMA (four doubles a lane, fused
 * multiply-adds in hardware rather than libm's fma), chosen at run time. */
__attribute__((target("avx2,fma"))) static void
pendulum_gym_chunk_avx2(const ps_model *m, int n, double *restrict th, double *restrict thd,
                        const double *restrict g, const double *restrict mass,
                        const double *restrict l, const float *restrict u, int32_t *restrict t,
                        double *restrict reward, uint8_t *restrict terminated,
                        uint8_t *restrict truncated)
{
  pendulum_gym_chunk(m, n, th, thd, g, mass, l, u, t, reward, terminated, truncated);
}
#define HAVE_AVX2_FMA() (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
#else
#define pendulum_gym_chunk_avx2 pendulum_gym_chunk_base
#define HAVE_AVX2_FMA() 0
#endif

static void dynamics_pendulum_gym(const ps_model *m, ps_data *d, const float *action,
                                  double *reward, uint8_t *terminated, uint8_t *truncated)
{
  const int B = d->B;
  const double *g = d->param + PS_PEND_G * B, *mass = d->param + PS_PEND_M * B,
               *l = d->param + PS_PEND_L * B;
  const int wide = HAVE_AVX2_FMA(), delay = m->delay; /* the nominal plant's */
  float u[GYM_CHUNK];
  double unused_reward[GYM_CHUNK];
  for (int b0 = 0; b0 < B; b0 += GYM_CHUNK) {
    const int n = B - b0 < GYM_CHUNK ? B - b0 : GYM_CHUNK;
    for (int j = 0; j < n; ++j) u[j] = actuator_command(m, d, b0 + j, action[b0 + j], delay);
    (wide ? pendulum_gym_chunk_avx2 : pendulum_gym_chunk_base)(
        m, n, d->x + b0, d->x + B + b0, g + b0, mass + b0, l + b0, u, d->t + b0,
        reward ? reward + b0 : unused_reward, terminated + b0, truncated + b0);
  }
}

/* The command environment b's plant receives in state x for the action a:
 * the catch's LQR command clip(-K e) where v = e'Pe is below catch_level,
 * the action where v is above PS_CATCH_BAND^2 times it, and between the two a
 * blend, the LQR's share falling linearly in sqrt(v) (a distance), so that
 * the handover does not jump (ps_model). */
static float caught_command(const ps_model *m, const double *x, float a)
{
  const int nx = m->nx;
  double e[PS_MAX_NX], v = 0.0, u = 0.0;
  for (int k = 0; k < nx; ++k)
    e[k] = plant_is_angle(m->system, k) ? angle_normalize(x[k]) : x[k];
  for (int i = 0; i < nx; ++i) {
    double row = 0.0;
    for (int k = 0; k < nx; ++k) row += m->catch_P[i * nx + k] * e[k];
    v += e[i] * row;
    u -= m->catch_K[i] * e[i];
  }
  const double r = v > 0 ? sqrt(v / m->catch_level) : 0.0;
  const double share = (PS_CATCH_BAND - r) / (PS_CATCH_BAND - 1.0); /* the LQR's: 1 inside */
  if (!(share > 0.0)) return a;
  u = u > m->u_max ? m->u_max : (u < -m->u_max ? -m->u_max : u);
  if (share >= 1.0) return (float)u;
  return (float)(share * u + (1.0 - share) * (double)a);
}

static void dynamics_generic(const ps_model *m, ps_data *d, const float *action,
                             double *reward, uint8_t *terminated, uint8_t *truncated)
{
  const int B = d->B;
  double x[PS_MAX_NX], p[PS_MAX_PARAMS];
  const int nominal = m->plant_mode == PS_PLANT_NOMINAL;
  for (int b = 0; b < B; ++b) {
    load(m, d, b, x, p);
    const float a = m->catch_level > 0 ? caught_command(m, x, action[b]) : action[b];
    const float u = actuator_command(m, d, b, a, env_delay(m, d, b));
    double r = step_reward(m, p, x, u);
    integrate(m, p, x, nominal ? u : actuator_input(m, d, b, u));
    for (int k = 0; k < m->nx; ++k) d->x[k * B + b] = x[k];
    r += end_of_step(m, d, b, x, terminated, truncated);
    if (reward) reward[b] = r;
  }
}

/* One step of every environment; actions already checked. Dynamics first,
 * environment by environment; then all observations at once; then resets. */
static void step_all(const ps_model *m, ps_data *d, const float *action, float *obs,
                     double *reward, uint8_t *terminated, uint8_t *truncated,
                     int autoreset, float *final_obs)
{
  const int B = d->B;
  if (m->gym_precision && m->system == PS_PENDULUM && m->plant_mode == PS_PLANT_NOMINAL)
    dynamics_pendulum_gym(m, d, action, reward, terminated, truncated);
  else
    dynamics_generic(m, d, action, reward, terminated, truncated);
  if (obs) observe_all(m, d, obs);
  if (final_obs && obs) memcpy(final_obs, obs, sizeof(float) * (size_t)B * m->nobs);
  if (!autoreset) return;
  for (int b = 0; b < B; ++b) {
    if (!terminated[b] && !truncated[b]) continue;
    reset_env(m, d, b);
    if (obs) observe_env(m, d, b, obs + (size_t)b * m->nobs);
  }
}

int ps_step(const ps_model *m, ps_data *d, const float *action, float *obs,
            double *reward, uint8_t *terminated, uint8_t *truncated, int autoreset,
            float *final_obs)
{
  if (!all_finite(action, (size_t)d->B)) return PS_ERR_NONFINITE;
  if (!terminated || !truncated) return PS_ERR_MODEL;
  if (ps_data_check(m, d) != PS_OK) return PS_ERR_DATA;
  step_all(m, d, action, obs, reward, terminated, truncated, autoreset, final_obs);
  return PS_OK;
}

int ps_rollout(const ps_model *m, ps_data *d, int K, const float *actions, float *obs,
               double *reward, uint8_t *terminated, uint8_t *truncated, int autoreset)
{
  const size_t B = (size_t)d->B;
  if (!all_finite(actions, (size_t)K * B)) return PS_ERR_NONFINITE;
  if (!terminated || !truncated) return PS_ERR_MODEL;
  if (ps_data_check(m, d) != PS_OK) return PS_ERR_DATA;
  for (int k = 0; k < K; ++k) {
    step_all(m, d, actions + k * B, obs ? obs + k * B * m->nobs : 0,
             reward ? reward + k * B : 0, terminated + k * B, truncated + k * B, autoreset, 0);
  }
  return PS_OK;
}

static int has_plant_arrays(const ps_data *d)
{
  return d->delay && d->motor_k && d->torque_noise && d->offset && d->tau && d->push &&
         d->push_left;
}

int ps_copy_envs(const ps_model *m, ps_data *dst, const int32_t *dst_idx,
                 const ps_data *src, const int32_t *src_idx, int n)
{
  for (int i = 0; i < n; ++i)
    if (dst_idx[i] < 0 || dst_idx[i] >= dst->B || src_idx[i] < 0 || src_idx[i] >= src->B)
      return PS_ERR_INDEX;
  if (ps_data_check(m, dst) != PS_OK || ps_data_check(m, src) != PS_OK) return PS_ERR_DATA;
  const int Bd = dst->B, Bs = src->B;
  const int plant_arrays = has_plant_arrays(dst) && has_plant_arrays(src);
  for (int i = 0; i < n; ++i) {
    const int a = dst_idx[i], b = src_idx[i];
    for (int k = 0; k < m->nx; ++k) dst->x[k * Bd + a] = src->x[k * Bs + b];
    for (int k = 0; k < m->nparam; ++k) dst->param[k * Bd + a] = src->param[k * Bs + b];
    for (int k = 0; k < PS_MAX_DELAY; ++k) dst->act_buf[k * Bd + a] = src->act_buf[k * Bs + b];
    dst->rng_key[a] = src->rng_key[b];
    dst->rng_ctr[a] = src->rng_ctr[b];
    dst->t[a] = src->t[b];
    if (!plant_arrays) continue;
    dst->delay[a] = src->delay[b];
    dst->motor_k[a] = src->motor_k[b];
    dst->torque_noise[a] = src->torque_noise[b];
    for (int k = 0; k < m->nx / 2; ++k) dst->offset[k * Bd + a] = src->offset[k * Bs + b];
    dst->tau[a] = src->tau[b];
    dst->push[a] = src->push[b];
    dst->push_left[a] = src->push_left[b];
  }
  return PS_OK;
}

int ps_data_check(const ps_model *m, const ps_data *d)
{
  return m->plant_mode == PS_PLANT_NOMINAL || has_plant_arrays(d) ? PS_OK : PS_ERR_DATA;
}

void ps_dynamics(const ps_model *m, const ps_data *d, int b, const double *x, double u,
                 double *xdot)
{
  double xs[PS_MAX_NX], p[PS_MAX_PARAMS];
  load(m, d, b, xs, p);
  plant_dynamics(m, p, x, u, xdot);
}

double ps_energy(const ps_model *m, const ps_data *d, int b, const double *x)
{
  double xs[PS_MAX_NX], p[PS_MAX_PARAMS];
  load(m, d, b, xs, p);
  return plant_energy(m, p, x);
}
