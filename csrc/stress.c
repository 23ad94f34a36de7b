/*
 * A stress test of the public API, meant to run under AddressSanitizer and
 * UndefinedBehaviorSanitizer (tests/test_sim_sanitizers.py builds it):
 * every preset with actuation delay, sensor noise and quantisation, random
 * and out-of-range actions, far-out states, autoreset, rollouts and branch
 * copies; each once with the nominal plant and once with plants drawn at
 * every reset (parameters, delay, motor response, actuator noise, pushes,
 * sensor offsets).
 * It checks, besides what the sanitizers check, that observations stay
 * finite, that a copy stepped with the same actions stays bit-identical,
 * that a NaN action is refused without touching the state, and that the
 * policy's rollout and update gradient (policy_rollout.h, policy_update.h)
 * stay finite and refuse malformed input.
 * Prints "ok <steps>" and exits 0, or names the first failure and exits 1.
 */
#include "pendsim.h"
#include "policy_rollout.h"
#include "policy_update.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NENV 96
#define NSTEP 50

typedef struct {
  double x[PS_MAX_NX * NENV], param[PS_MAX_PARAMS * NENV];
  float act_buf[PS_MAX_DELAY * NENV];
  uint64_t key[NENV], ctr[NENV];
  int32_t t[NENV];
  int32_t delay[NENV], push_left[NENV];
  double motor_k[NENV], torque_noise[NENV], offset[PS_MAX_NX / 2 * NENV], tau[NENV],
      push[NENV];
  ps_data d;
} batch;

static void batch_init(batch *s)
{
  memset(s, 0, sizeof *s);
  const ps_data d = {.B = NENV, .x = s->x, .param = s->param, .act_buf = s->act_buf,
                     .rng_key = s->key, .rng_ctr = s->ctr, .t = s->t, .delay = s->delay,
                     .motor_k = s->motor_k, .torque_noise = s->torque_noise,
                     .offset = s->offset, .tau = s->tau, .push = s->push,
                     .push_left = s->push_left};
  s->d = d;
}

/* Wide ranges around the preset: every parameter +-50% (the double
 * pendulum's +-10%: its inertias about the joints, drawn apart from its
 * masses, must stay above the parallel-axis bound), delays up to the
 * longest, a slow motor, actuator noise, frequent long pushes, offsets. */
static void draw_plants(ps_model *m)
{
  ps_plant_ranges *r = &m->ranges;
  const double spread = m->system == PS_DOUBLE_PENDULUM ? 0.1 : 0.5;
  m->plant_mode = PS_PLANT_DRAW;
  for (int k = 0; k < m->nparam; ++k) {
    r->param_lo[k] = (1.0 - spread) * m->param[k];
    r->param_hi[k] = (1.0 + spread) * m->param[k];
  }
  r->delay_lo = 0;
  r->delay_hi = PS_MAX_DELAY;
  r->motor_k_lo = 0.1;
  r->motor_k_hi = 1.0;
  r->torque_noise_lo = 0.0;
  r->torque_noise_hi = 0.1 * m->u_max;
  for (int k = 0; k < m->nx / 2; ++k) {
    r->offset_lo[k] = -0.05;
    r->offset_hi[k] = 0.05;
  }
  r->push_rate = 20.0;
  r->push_lo = 0.0;
  r->push_hi = m->u_max;
  r->push_steps = 7;
}

static uint64_t lcg = 12345;
static float random_action(double scale)
{
  lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)(scale * ((double)(lcg >> 11) * 0x1.0p-53 * 2.0 - 1.0));
}

static int fail(const char *what, const char *system, const char *preset)
{
  printf("FAIL %s (%s/%s)\n", what, system, preset);
  return 1;
}

int main(void)
{
  static batch a, c;
  static float actions[NSTEP * NENV];
  static float obs[NSTEP * NENV * PS_MAX_NOBS], obs_c[NSTEP * NENV * PS_MAX_NOBS];
  static double reward[NSTEP * NENV], reward_c[NSTEP * NENV];
  static uint8_t term[NSTEP * NENV], trunc[NSTEP * NENV];
  static int32_t idx[NENV], src[NENV];
  long steps = 0;
  for (int s = 0; s < PS_NUM_SYSTEMS; ++s) {
    const char *system = ps_system_name(s);
    for (int p = 0; p < 2 * ps_num_presets(s); ++p) {
      const char *preset = ps_preset_name(s, p / 2);
      ps_model m;
      if (ps_model_init(&m, s, preset) != PS_OK) return fail("model_init", system, preset);
      m.delay = 3;
      if (p % 2) {
        draw_plants(&m);
        /* a catch over much of the state space: its LQR, its blend and the action all act */
        m.catch_level = 4.0;
        for (int k = 0; k < m.nx; ++k) {
          m.catch_K[k] = 1.0 + k;
          m.catch_P[k * m.nx + k] = 1.0;
        }
      }
      for (int k = 0; k < m.nx; ++k) {
        m.noise_std[k] = 0.01;
        if (k == 0) m.enc_counts[k] = 1024;
      }
      if (ps_model_check(&m) != PS_OK) return fail("model_check", system, preset);
      batch_init(&a);
      uint64_t seeds[NENV];
      for (int b = 0; b < NENV; ++b) seeds[b] = (uint64_t)(b * 7 + s);
      ps_seed(&a.d, seeds);
      ps_reset(&m, &a.d, NULL, obs);
      for (int round = 0; round < 4; ++round) {
        /* actions up to twice the limit, so saturation is exercised */
        for (int i = 0; i < NSTEP * NENV; ++i) actions[i] = random_action(2.0 * m.u_max);
        /* a copy of every environment, in reverse order */
        batch_init(&c);
        for (int b = 0; b < NENV; ++b) idx[b] = NENV - 1 - b, src[b] = b;
        if (ps_copy_envs(&m, &c.d, idx, &a.d, src, NENV) != PS_OK)
          return fail("copy_envs", system, preset);
        if (ps_rollout(&m, &a.d, NSTEP, actions, obs, reward, term, trunc, 1) != PS_OK)
          return fail("rollout", system, preset);
        /* the copy, stepped one call at a time with the mirrored actions */
        for (int k = 0; k < NSTEP; ++k) {
          float act_c[NENV];
          for (int b = 0; b < NENV; ++b) act_c[b] = actions[k * NENV + (NENV - 1 - b)];
          if (ps_step(&m, &c.d, act_c, obs_c + (size_t)k * NENV * m.nobs, reward_c + k * NENV,
                      term + 0, trunc + 0, 1, NULL) != PS_OK)
            return fail("step", system, preset);
          for (int b = 0; b < NENV; ++b) {
            const float *o = obs + ((size_t)k * NENV + b) * m.nobs;
            const float *oc = obs_c + ((size_t)k * NENV + (NENV - 1 - b)) * m.nobs;
            if (memcmp(o, oc, sizeof(float) * m.nobs) != 0 ||
                reward[k * NENV + b] != reward_c[k * NENV + (NENV - 1 - b)])
              return fail("a copy diverged from its original", system, preset);
            for (int j = 0; j < m.nobs; ++j)
              if (!isfinite(o[j])) return fail("non-finite observation", system, preset);
          }
        }
        steps += 2L * NSTEP * NENV;
      }
      /* the policy rollout (policy_rollout.h): a random network with features, commands
       * held two steps, the action-rate penalty; everything it writes finite and in range */
      {
        static float params[4096], work[16384], spread[NSTEP * NENV], mu[NSTEP * NENV],
            z[NSTEP * NENV], last[NENV], act[NENV];
        static double rew[NSTEP * NENV], step_rew[NENV];
        static uint8_t alive[(NSTEP + 1) * NENV], tm[NENV], tr[NENV];
        const pr_net net = {.nobs = m.nobs, .nfeat = 9, .nhidden = 2, .width = 7,
                            .params = params};
        const size_t nparam = pr_net_num_params(&net);
        if (nparam == 0 || nparam > 4096 || pr_work_size(&net, NENV) > 16384)
          return fail("policy network sizes", system, preset);
        for (size_t i = 0; i < nparam; ++i) params[i] = random_action(2.0);
        for (int i = 0; i < NSTEP * NENV; ++i) spread[i] = random_action(3.0);
        memset(alive, 1, NENV);
        ps_observe(&m, &a.d, obs_c);
        if (pr_rollout(&m, &a.d, &net, NSTEP, 2, 0, m.u_max, 0.1, spread, obs_c, obs, mu, z,
                       rew, alive, last, 0, act, step_rew, tm, tr, work) != PS_OK)
          return fail("policy rollout", system, preset);
        for (int i = 0; i < NSTEP * NENV; ++i)
          if (!isfinite(mu[i]) || z[i] != mu[i] + spread[i] || !isfinite(rew[i]) ||
              alive[NENV + i] > alive[i])
            return fail("policy rollout's outputs", system, preset);
        for (int b = 0; b < NENV; ++b)
          if (!(fabsf(last[b]) <= (float)m.u_max)) return fail("command", system, preset);
        /* a batch that is not a whole number of tiles; a malformed network refused */
        pr_net bad = net;
        bad.nhidden = 0;
        if (pr_mean(&net, 37, obs, mu, work) != PS_OK ||
            pr_mean(&bad, 37, obs, mu, work) != PS_ERR_MODEL ||
            pr_rollout(&m, &a.d, &net, 1, 0, 0, m.u_max, 0.0, spread, obs_c, obs, mu, z, rew,
                       alive, last, 0, act, step_rew, tm, tr, work) != PS_ERR_MODEL)
          return fail("policy network checks", system, preset);
        steps += 2L * NSTEP * NENV;
        /* the update's gradient (policy_update.h) over the rollout's steps as a batch of
         * NSTEP branches of NENV steps: three hidden layers of 7, 9 features, 37 rows
         * with repeats (not a whole number of chunks), some steps masked out; every
         * gradient finite, bad rows and networks refused */
        static float wts[4096], grads[4096], logp[NSTEP * NENV], adv[NSTEP * NENV],
            mask[NSTEP * NENV], uwork[65536];
        pu_net un = {.nobs = m.nobs, .nfeat = 9, .nhidden = 3, .width = 7};
        size_t at = 0;
        un.feat_B = wts + at;
        at += 9 * (size_t)m.nobs;
        un.feat_b = wts + at;
        at += 9;
        for (int l = 0; l <= 3; ++l) {
          const size_t nin = l == 0 ? 9 + (size_t)m.nobs : 7, nout = l == 3 ? 1 : 7;
          un.W[l] = wts + at;
          un.gW[l] = grads + at;
          at += nin * nout;
          un.b[l] = wts + at;
          un.gb[l] = grads + at;
          at += nout;
        }
        if (at > 4096 || pu_work_size(&un) == 0 || pu_work_size(&un) > 65536)
          return fail("update network sizes", system, preset);
        for (size_t i = 0; i < at; ++i) wts[i] = random_action(1.0);
        for (int i = 0; i < NSTEP * NENV; ++i) {
          logp[i] = random_action(4.0) - 1.0f;
          adv[i] = random_action(2.0);
          mask[i] = i % 7 == 3 ? 0.0f : 1.0f;
        }
        const pu_batch ub = {.B = NSTEP, .L = NENV, .obs = obs, .z = z, .logp_old = logp,
                             .adv = adv, .mask = mask};
        int64_t rows[37];
        for (int i = 0; i < 37; ++i) rows[i] = (i * 13) % NSTEP;
        pu_stats st;
        float g_log_std = 0.0f;
        for (int agg = PU_AGG_TOKEN; agg <= PU_AGG_DR_GRPO; ++agg) {
          if (pu_gradient(&un, -0.5f, &ub, rows, 37, agg, 0.2f, 0.28f, agg == 0 ? 1.0 : 0.0,
                          &g_log_std, &st, uwork) != PU_OK ||
              !isfinite(g_log_std) || !isfinite(st.loss) || !isfinite(st.grad_norm))
            return fail("update gradient", system, preset);
          for (size_t i = 0; i < at; ++i)
            if (!isfinite(grads[i])) return fail("update gradient's values", system, preset);
        }
        if (pu_mean(&un, &ub, rows, 37, mu, uwork) != PU_OK)
          return fail("update mean", system, preset);
        for (int i = 0; i < 37 * NENV; ++i)
          if (!isfinite(mu[i])) return fail("update mean's values", system, preset);
        /* the diagnostics: KL to pi_old (the batch's z as its means) and the entropy */
        double kl = -1.0, entropy = 0.0;
        if (pu_kl_old(&un, &ub, z, rows, 37, -0.3, -0.5, &kl, uwork) != PU_OK || !(kl >= 0.0) ||
            pu_squashed_entropy(NSTEP, NENV, 1, 3, logp, z, mask, log(m.u_max), &entropy) !=
                PU_OK ||
            !isfinite(entropy))
          return fail("update diagnostics", system, preset);
        rows[5] = NSTEP;
        pu_net unbad = un;
        unbad.nhidden = 0;
        if (pu_gradient(&un, -0.5f, &ub, rows, 37, 0, 0.2f, 0.28f, 1.0, &g_log_std, &st,
                        uwork) != PU_ERR_ARGS ||
            pu_mean(&un, &ub, rows, 37, mu, uwork) != PU_ERR_ARGS ||
            pu_mean(&unbad, &ub, rows, 1, mu, uwork) != PU_ERR_ARGS ||
            pu_kl_old(&un, &ub, z, rows, 37, -0.3, -0.5, &kl, uwork) != PU_ERR_ARGS ||
            pu_squashed_entropy(NSTEP, NENV, 0, 0, logp, z, mask, 0.0, &entropy) != PU_ERR_ARGS ||
            pu_work_size(&unbad) != 0)
          return fail("update checks", system, preset);
      }
      /* a NaN action: refused, state untouched */
      memcpy(c.x, a.x, sizeof a.x);
      const uint64_t ctr0 = a.ctr[0];
      float bad[NENV] = {0};
      bad[NENV / 2] = NAN;
      if (ps_step(&m, &a.d, bad, obs, reward, term, trunc, 0, NULL) != PS_ERR_NONFINITE ||
          memcmp(c.x, a.x, sizeof a.x) != 0 || a.ctr[0] != ctr0)
        return fail("NaN action not refused cleanly", system, preset);
      /* states far beyond any episode (a user's set_state): stepped without harm */
      for (int b = 0; b < NENV; ++b) a.x[b] = (b % 3 == 0) ? 1e300 : (b % 3 == 1) ? -3e7 : 1e5;
      if (ps_step(&m, &a.d, actions, obs, reward, term, trunc, 1, NULL) != PS_OK)
        return fail("far states", system, preset);
      idx[0] = NENV;
      if (ps_copy_envs(&m, &c.d, idx, &a.d, src, 1) != PS_ERR_INDEX)
        return fail("out-of-range copy not refused", system, preset);
      /* drawn plants need their arrays */
      c.d.tau = NULL;
      if (m.plant_mode != PS_PLANT_NOMINAL &&
          (ps_step(&m, &c.d, actions, obs, reward, term, trunc, 1, NULL) != PS_ERR_DATA ||
           ps_data_check(&m, &c.d) != PS_ERR_DATA))
        return fail("missing plant arrays not refused", system, preset);
    }
  }
  printf("ok %ld\n", steps);
  return 0;
}
