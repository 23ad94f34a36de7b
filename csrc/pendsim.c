/*
 * pendsim: batched stepping, resets, sensors, RNG and branching.
 * The plants' equations live in plants.c.
 */
#include "pendsim.h"
#include "plants.h"

#include <math.h>
#include <string.h>

static const double PI = 3.14159265358979323846;

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

/* NumPy's float remainder (sign of the divisor), as Gymnasium's
 * angle_normalize uses it: ((x + pi) % (2 pi)) - pi. */
static double angle_normalize(double x)
{
  const double two_pi = 2 * PI;
  double r = fmod(x + PI, two_pi);
  if (r != 0.0) {
    if (r < 0) r += two_pi;
  } else {
    r = 0.0;
  }
  return r - PI;
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

/* Gymnasium's Pendulum-v1 step, term by term in the precision NumPy 2 gives
 * it: the float32 action meets Python floats and stays float32, then meets
 * the float64 state. Returns the cost of the pre-step state. */
static double pendulum_gym_step(const ps_model *m, const double *p, double *x, float u)
{
  const double g = p[PS_PEND_G], mass = p[PS_PEND_M], l = p[PS_PEND_L];
  const double th = x[0], thd = x[1], dt = m->dt;
  const double an = angle_normalize(th);
  /* NumPy's float32 u**2 goes through a vectorised pow that is sometimes one
   * ulp off u * u; that moves the reward by at most 5e-10 at |u| <= 2. */
  const float u_sq = u * u;
  const double cost = an * an + m->w_x[1] * (thd * thd) + (double)((float)m->w_u * u_sq);
  const float torque_term = (float)(3.0 / (mass * (l * l))) * u;
  double newthd = thd + (3 * g / (2 * l) * sin(th) + (double)torque_term) * dt;
  if (newthd > m->v_max) newthd = m->v_max;
  if (newthd < -m->v_max) newthd = -m->v_max;
  x[0] = th + newthd * dt;
  x[1] = newthd;
  return cost;
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

static void observe_env(const ps_model *m, ps_data *d, int b, const double *x_true,
                        float *obs)
{
  double x[PS_MAX_NX];
  for (int k = 0; k < m->nx; ++k) {
    x[k] = x_true[k];
    if (m->noise_std[k] > 0) x[k] += m->noise_std[k] * rng_normal(d, b);
    if (m->enc_counts[k] > 0) {
      const double q = 2 * PI / m->enc_counts[k];
      x[k] = q * floor(x[k] / q + 0.5);
    }
  }
  switch (m->system) {
  case PS_PENDULUM:
    obs[0] = (float)cos(x[0]);
    obs[1] = (float)sin(x[0]);
    obs[2] = (float)x[1];
    break;
  case PS_CARTPOLE:
    obs[0] = (float)x[0];
    obs[1] = (float)x[1];
    obs[2] = (float)cos(x[2]);
    obs[3] = (float)sin(x[2]);
    obs[4] = (float)x[3];
    break;
  default:
    obs[0] = (float)cos(x[0]);
    obs[1] = (float)sin(x[0]);
    obs[2] = (float)cos(x[1]);
    obs[3] = (float)sin(x[1]);
    obs[4] = (float)x[2];
    obs[5] = (float)x[3];
    break;
  }
}

static void reset_env(const ps_model *m, ps_data *d, int b)
{
  const int B = d->B;
  for (int k = 0; k < m->nparam; ++k) d->param[k * B + b] = m->param[k];
  for (int k = 0; k < m->nx; ++k) {
    const double lo = m->x0_low[k], hi = m->x0_high[k];
    d->x[k * B + b] = lo + (hi - lo) * rng_uniform(d, b);
  }
  for (int i = 0; i < PS_MAX_DELAY; ++i) d->act_buf[i * B + b] = 0.0f;
  d->t[b] = 0;
}

/* ------------------------------------------------------------------------
 * Public API.
 * ---------------------------------------------------------------------- */
void ps_observe(const ps_model *m, ps_data *d, float *obs)
{
  double x[PS_MAX_NX], p[PS_MAX_PARAMS];
  for (int b = 0; b < d->B; ++b) {
    load(m, d, b, x, p);
    observe_env(m, d, b, x, obs + (size_t)b * m->nobs);
  }
}

void ps_reset(const ps_model *m, ps_data *d, const uint8_t *mask, float *obs)
{
  double x[PS_MAX_NX], p[PS_MAX_PARAMS];
  for (int b = 0; b < d->B; ++b) {
    if (mask && !mask[b]) continue;
    reset_env(m, d, b);
    if (obs) {
      load(m, d, b, x, p);
      observe_env(m, d, b, x, obs + (size_t)b * m->nobs);
    }
  }
}

static int all_finite(const float *a, size_t n)
{
  for (size_t i = 0; i < n; ++i)
    if (!isfinite(a[i])) return 0;
  return 1;
}

/* One step of every environment; actions already checked. */
static void step_all(const ps_model *m, ps_data *d, const float *action, float *obs,
                     double *reward, uint8_t *terminated, uint8_t *truncated,
                     int autoreset, float *final_obs)
{
  const int B = d->B, nx = m->nx, delay = m->delay;
  const float u_max = (float)m->u_max;
  double x[PS_MAX_NX], p[PS_MAX_PARAMS];
  float obs_b[PS_MAX_NOBS];
  for (int b = 0; b < B; ++b) {
    /* the action that reaches the actuator now: delayed, then saturated */
    float u = action[b];
    if (delay > 0) {
      float *buf = d->act_buf;
      const float oldest = buf[b];
      for (int i = 0; i + 1 < delay; ++i) buf[i * B + b] = buf[(i + 1) * B + b];
      buf[(delay - 1) * B + b] = u;
      u = oldest;
    }
    if (u > u_max) u = u_max;
    else if (u < -u_max) u = -u_max;

    load(m, d, b, x, p);
    double r;
    if (m->gym_precision && m->system == PS_PENDULUM) {
      r = -pendulum_gym_step(m, p, x, u);
    } else {
      r = m->reward_kind == PS_REWARD_ALIVE ? 1.0 : -quadratic_cost(m, x, u);
      integrate(m, p, x, u);
    }
    for (int k = 0; k < nx; ++k) d->x[k * B + b] = x[k];

    int term = 0;
    for (int k = 0; k < nx; ++k)
      if (m->term_limit[k] > 0 && fabs(x[k]) > m->term_limit[k]) term = 1;
    if (term) r += m->term_reward;
    const int t = ++d->t[b];
    const int trunc = m->max_steps > 0 && t >= m->max_steps;

    if (reward) reward[b] = r;
    if (terminated) terminated[b] = (uint8_t)term;
    if (truncated) truncated[b] = (uint8_t)trunc;
    if (obs || final_obs) {
      observe_env(m, d, b, x, obs_b);
      if (final_obs) memcpy(final_obs + (size_t)b * m->nobs, obs_b, sizeof(float) * m->nobs);
      if (autoreset && (term || trunc)) {
        reset_env(m, d, b);
        load(m, d, b, x, p);
        observe_env(m, d, b, x, obs_b);
      }
      if (obs) memcpy(obs + (size_t)b * m->nobs, obs_b, sizeof(float) * m->nobs);
    } else if (autoreset && (term || trunc)) {
      reset_env(m, d, b);
    }
  }
}

int ps_step(const ps_model *m, ps_data *d, const float *action, float *obs,
            double *reward, uint8_t *terminated, uint8_t *truncated, int autoreset,
            float *final_obs)
{
  if (!all_finite(action, (size_t)d->B)) return PS_ERR_NONFINITE;
  step_all(m, d, action, obs, reward, terminated, truncated, autoreset, final_obs);
  return PS_OK;
}

int ps_rollout(const ps_model *m, ps_data *d, int K, const float *actions, float *obs,
               double *reward, uint8_t *terminated, uint8_t *truncated, int autoreset)
{
  const size_t B = (size_t)d->B;
  if (!all_finite(actions, (size_t)K * B)) return PS_ERR_NONFINITE;
  for (int k = 0; k < K; ++k) {
    step_all(m, d, actions + k * B, obs ? obs + k * B * m->nobs : 0,
             reward ? reward + k * B : 0, terminated ? terminated + k * B : 0,
             truncated ? truncated + k * B : 0, autoreset, 0);
  }
  return PS_OK;
}

int ps_copy_envs(const ps_model *m, ps_data *dst, const int32_t *dst_idx,
                 const ps_data *src, const int32_t *src_idx, int n)
{
  for (int i = 0; i < n; ++i)
    if (dst_idx[i] < 0 || dst_idx[i] >= dst->B || src_idx[i] < 0 || src_idx[i] >= src->B)
      return PS_ERR_INDEX;
  const int Bd = dst->B, Bs = src->B;
  for (int i = 0; i < n; ++i) {
    const int a = dst_idx[i], b = src_idx[i];
    for (int k = 0; k < m->nx; ++k) dst->x[k * Bd + a] = src->x[k * Bs + b];
    for (int k = 0; k < m->nparam; ++k) dst->param[k * Bd + a] = src->param[k * Bs + b];
    for (int k = 0; k < PS_MAX_DELAY; ++k) dst->act_buf[k * Bd + a] = src->act_buf[k * Bs + b];
    dst->rng_key[a] = src->rng_key[b];
    dst->rng_ctr[a] = src->rng_ctr[b];
    dst->t[a] = src->t[b];
  }
  return PS_OK;
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
