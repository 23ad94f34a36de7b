/*
 * policy_update: the clipped-ratio loss's gradient in C (policy_update.h).
 * The network's arithmetic is float32, as torch's; the sums over steps of
 * the loss and of log_std's gradient are double.
 */
#include "policy_update.h"

#include <math.h>
#include <string.h>

#include "policy_dense.h"

/* Steps per chunk: the chunk's activations (~200 kB at the gym default) stay in
 * L2 between the forward and the backward pass (256: 4 % faster than 128 on a Zen 4,
 * 512 slower). A multiple of TILE. Their rows
 * are PITCH floats apart: off a multiple of 256 (stride(), policy_dense.h). */
#define CHUNK 256
#define PITCH (CHUNK % 256 ? CHUNK : CHUNK + TILE)
#define LOG_2PI 1.8378770664093453f

/* The workspace, carved (pu_work_size counts what carve takes). */
typedef struct {
  float *in;                      /* (nfeat + nobs) x PITCH: features, then x */
  float *h[PU_MAX_HIDDEN];        /* width x PITCH: the hidden layers' outputs */
  float *mu, *dmu;                /* CHUNK: output, and the loss's gradient with respect to it */
  float *dh[2];                   /* width x PITCH: gradients at hidden layers, alternately */
  float *feat_W;                  /* nfeat x nobs: B transposed, dense()'s layout */
  float *WT[PU_MAX_HIDDEN];       /* hidden layer l >= 1's weight transposed (width x width) */
  float *zeros;                   /* a zero bias for the backward pass's dense() */
  float *gacc[PU_MAX_HIDDEN + 1]; /* per-lane gradient sums: (out * in) x TILE */
  float *gbacc[PU_MAX_HIDDEN + 1];/* out x TILE */
  float *lane_z, *lane_logp_old, *lane_adv, *lane_mask, *lane_weight; /* CHUNK each */
} parts;

static int net_ok(const pu_net *net)
{
  if (!net || net->nobs < 1 || net->nfeat < 0 || net->nhidden < 1 ||
      net->nhidden > PU_MAX_HIDDEN || net->width < 1)
    return 0;
  if (net->nfeat && (!net->feat_B || !net->feat_b)) return 0;
  for (int l = 0; l <= net->nhidden; ++l)
    if (!net->W[l] || !net->b[l]) return 0;
  return 1;
}

static int batch_ok(const pu_batch *bt, const int64_t *rows, int nrows)
{
  if (!bt || bt->B < 1 || bt->L < 1 || !bt->obs || !bt->z || !bt->logp_old || !bt->adv ||
      !bt->mask || !rows || nrows < 1)
    return 0;
  for (int i = 0; i < nrows; ++i)
    if (rows[i] < 0 || rows[i] >= bt->B) return 0;
  return 1;
}

static int fan_in(const pu_net *net, int l) { return l == 0 ? net->nfeat + net->nobs : net->width; }
static int fan_out(const pu_net *net, int l) { return l == net->nhidden ? 1 : net->width; }

/* Carves work into p (work NULL: only counts), each part whole cache lines from
 * the last (work line_aligned). Returns the floats taken. */
static size_t carve(const pu_net *net, float *work, parts *p)
{
  const size_t S = PITCH, f = (size_t)net->nfeat, n = (size_t)net->nobs, w = (size_t)net->width;
  size_t at = 0;
#define TAKE(ptr, count)                                                  \
  do {                                                                    \
    if (work) (ptr) = work + at;                                          \
    at += ((size_t)(count) + LINE_FLOATS - 1) / LINE_FLOATS * LINE_FLOATS; \
  } while (0)
  TAKE(p->in, (f + n) * S);
  for (int l = 0; l < net->nhidden; ++l) TAKE(p->h[l], w * S);
  TAKE(p->mu, S);
  TAKE(p->dmu, S);
  TAKE(p->dh[0], w * S);
  TAKE(p->dh[1], w * S);
  TAKE(p->feat_W, f * n);
  for (int l = 1; l < net->nhidden; ++l) TAKE(p->WT[l], w * w);
  TAKE(p->zeros, f + n > w ? f + n : w);
  for (int l = 0; l <= net->nhidden; ++l) {
    const size_t out = (size_t)fan_out(net, l), in = (size_t)fan_in(net, l);
    TAKE(p->gacc[l], out * in * TILE);
    TAKE(p->gbacc[l], out * TILE);
  }
  TAKE(p->lane_z, S);
  TAKE(p->lane_logp_old, S);
  TAKE(p->lane_adv, S);
  TAKE(p->lane_mask, S);
  TAKE(p->lane_weight, S);
#undef TAKE
  return at;
}

size_t pu_work_size(const pu_net *net)
{
  parts p;
  return net_ok(net) ? carve(net, NULL, &p) + LINE_FLOATS : 0;
}

/* The weights' copies the kernels want: B and the hidden layers' weights transposed. */
static void prepare(const pu_net *net, parts *p)
{
  const int f = net->nfeat, n = net->nobs, w = net->width;
  for (int k = 0; k < n; ++k)
    for (int j = 0; j < f; ++j) p->feat_W[(size_t)j * n + k] = net->feat_B[(size_t)k * f + j];
  for (int l = 1; l < net->nhidden; ++l)
    for (int j = 0; j < w; ++j)
      for (int i = 0; i < w; ++i) p->WT[l][(size_t)i * w + j] = net->W[l][(size_t)j * w + i];
  const int nz = f + n > w ? f + n : w;
  for (int i = 0; i < nz; ++i) p->zeros[i] = 0.0f;
}

/* Where fill is in the flattened steps (branch rows[i / L], step i % L), and
 * each lane's weight in the average (aggregate_loss): scale per step of a
 * branch, the grpo aggregation's per branch. */
typedef struct {
  long next, total;
  int agg;
  double token, dr_grpo;
  long scaled_row; /* grpo: the branch whose scale row_scale is */
  double row_scale;
} cursor;

static double row_mask_sum(const pu_batch *bt, int64_t r)
{
  double m = 0.0;
  for (int t = 0; t < bt->L; ++t) m += bt->mask[(size_t)r * bt->L + t];
  return m;
}

/* Whether none of the TILE steps from flattened step i on can move the loss:
 * each has mask 0 or advantage 0, so its weight or its surrogate is 0, and it
 * adds exactly 0 to every sum. */
static int idle_tile(const pu_batch *bt, const int64_t *rows, long i, long total)
{
  const int L = bt->L;
  for (long k = i; k < i + TILE && k < total; ++k) {
    const size_t at = (size_t)rows[k / L] * (size_t)L + (size_t)(k % L);
    if (bt->mask[at] != 0.0f && bt->adv[at] != 0.0f) return 0;
  }
  return 1;
}

/* Fills the chunk's lanes from the cursor on, step i in lane i % TILE.
 * pu_gradient (every 0) passes over whole tiles of idle_tile: each lane then
 * adds the same nonzero terms in the same order as with them, so every sum
 * keeps its bits. pu_mean (every 1) takes every step. The lanes after the last
 * are padded with zeros, whose weight 0 keeps them out of every sum. Returns
 * how many lanes hold steps. */
static int fill(const pu_net *net, const pu_batch *bt, const int64_t *rows, int nrows,
                int every, cursor *c, parts *p)
{
  const int n = net->nobs, L = bt->L;
  float *x = p->in + (size_t)net->nfeat * PITCH;
  int s = 0;
  while (s < CHUNK && c->next < c->total) {
    const long i = c->next;
    if (!every && i % TILE == 0 && idle_tile(bt, rows, i, c->total)) {
      c->next += TILE; /* its lanes stay free for the next tile */
      continue;
    }
    ++c->next;
    const size_t at = (size_t)rows[i / L] * (size_t)L + (size_t)(i % L);
    for (int k = 0; k < n; ++k) x[(size_t)k * PITCH + s] = bt->obs[at * n + k];
    p->lane_z[s] = bt->z[at];
    p->lane_logp_old[s] = bt->logp_old[at];
    p->lane_adv[s] = bt->adv[at];
    p->lane_mask[s] = bt->mask[at];
    double scale = c->agg == PU_AGG_DR_GRPO ? c->dr_grpo : c->token;
    if (c->agg == PU_AGG_GRPO) {
      if (i / L != c->scaled_row) { /* a new branch: its steps' mean weighs 1 / nrows */
        const double m = row_mask_sum(bt, rows[i / L]);
        c->row_scale = 1.0 / ((m > 1.0 ? m : 1.0) * nrows);
        c->scaled_row = i / L;
      }
      scale = c->row_scale;
    }
    p->lane_weight[s] = (float)(p->lane_mask[s] * scale);
    ++s;
  }
  const int count = s;
  for (; s < CHUNK; ++s) {
    for (int k = 0; k < n; ++k) x[(size_t)k * PITCH + s] = 0.0f;
    p->lane_z[s] = p->lane_logp_old[s] = p->lane_adv[s] = p->lane_mask[s] = 0.0f;
    p->lane_weight[s] = 0.0f;
  }
  return count;
}

static void forward(const pu_net *net, parts *p)
{
  const int f = net->nfeat, n = net->nobs, w = net->width;
  const float *x = p->in + (size_t)f * PITCH;
  if (f) dense(PITCH, CHUNK, n, f, p->feat_W, net->feat_b, x, p->in, ACT_SIN);
  const float *a = f ? p->in : x;
  int nin = f + n;
  for (int l = 0; l < net->nhidden; ++l) {
    dense(PITCH, CHUNK, nin, w, net->W[l], net->b[l], a, p->h[l], ACT_RELU);
    a = p->h[l];
    nin = w;
  }
  dense(PITCH, CHUNK, w, 1, net->W[net->nhidden], net->b[net->nhidden], a, p->mu, ACT_NONE);
}

/* dy[j][s] = scale[j] dmu[s] where out[j][s] > 0, else 0: the gradient at a ReLU
 * layer's input, from the loss's gradient at the linear output scale . out. */
PR_CLONES
static void relu_grad_outer(int nout, const float *scale, const float *restrict dmu,
                            const float *restrict out, float *restrict dy)
{
  for (int j = 0; j < nout; ++j) {
    const float sj = scale[j];
    for (int s = 0; s < CHUNK; ++s) {
      const size_t at = (size_t)j * PITCH + s;
      const float v = sj * dmu[s];
      dy[at] = out[at] > 0.0f ? v : 0.0f;
    }
  }
}

/* g[j][s] = 0 where out[j][s] <= 0, for rows j < rows: ReLU's gradient, 1 where its
 * output was > 0. */
PR_CLONES
static void relu_grad(int rows, const float *restrict out, float *restrict g)
{
  for (int j = 0; j < rows; ++j)
    for (int s = 0; s < CHUNK; ++s) {
      const size_t i = (size_t)j * PITCH + s;
      g[i] = out[i] > 0.0f ? g[i] : 0.0f;
    }
}

/* The loss's gradient with respect to the chunk's outputs (into dmu), its
 * share of the loss and of log_std's gradient, and the clip's counts. */
typedef struct {
  double loss, glog_std, low, high;
} sums;

static void loss_grad(parts *p, float log_std, float eps_low, float eps_high, sums *acc)
{
  const float inv_std = expf(-log_std), lo = 1.0f - eps_low, hi = 1.0f + eps_high;
  for (int s = 0; s < CHUNK; ++s) {
    const float weight = p->lane_weight[s];
    p->dmu[s] = 0.0f;
    if (weight == 0.0f) continue;
    const float u = (p->lane_z[s] - p->mu[s]) * inv_std;
    const float logp = -0.5f * (u * u) - log_std - 0.5f * LOG_2PI;
    const float r = expf(logp - p->lane_logp_old[s]), A = p->lane_adv[s];
    const int low = A < 0.0f && r < lo, high = A > 0.0f && r > hi;
    const float rc = r < lo ? lo : r > hi ? hi : r;
    const float obj = fminf(r * A, rc * A);
    acc->loss -= (double)weight * obj;
    acc->low += low ? p->lane_mask[s] : 0.0;
    acc->high += high ? p->lane_mask[s] : 0.0;
    if (low || high) continue; /* the clipped term is the smaller: no gradient */
    const float g = -weight * A * r; /* d loss / d logp */
    p->dmu[s] = g * u * inv_std;
    acc->glog_std += (double)g * ((double)u * u - 1.0);
  }
}

/* Gradients from dmu back to every layer's weights, into the lane accumulators. */
static void backward(const pu_net *net, parts *p)
{
  const int nh = net->nhidden, w = net->width, S = PITCH;
  grad_acc(S, CHUNK, w, 1, p->dmu, p->h[nh - 1], p->gacc[nh], p->gbacc[nh]);
  int cur = 0;
  float *dy = p->dh[cur];
  relu_grad_outer(w, net->W[nh], p->dmu, p->h[nh - 1], dy);
  for (int l = nh - 1; l >= 0; --l) {
    const float *a = l ? p->h[l - 1] : p->in;
    grad_acc(S, CHUNK, fan_in(net, l), w, dy, a, p->gacc[l], p->gbacc[l]);
    if (l == 0) break;
    float *dx = p->dh[1 - cur];
    cur = 1 - cur;
    dense(S, CHUNK, w, w, p->WT[l], p->zeros, dy, dx, ACT_NONE);
    relu_grad(w, a, dx);
    dy = dx;
  }
}

int pu_gradient(const pu_net *net, float log_std, const pu_batch *bt, const int64_t *rows,
                int nrows, int agg, float eps_low, float eps_high, double max_grad_norm,
                float *grad_log_std, pu_stats *stats, float *work)
{
  if (!net_ok(net) || !batch_ok(bt, rows, nrows) || !grad_log_std || !stats || !work ||
      agg < PU_AGG_TOKEN || agg > PU_AGG_DR_GRPO || !(max_grad_norm >= 0.0))
    return PU_ERR_ARGS;
  for (int l = 0; l <= net->nhidden; ++l)
    if (!net->gW[l] || !net->gb[l]) return PU_ERR_ARGS;
  parts p;
  carve(net, line_aligned(work), &p);
  prepare(net, &p);
  for (int l = 0; l <= net->nhidden; ++l) {
    memset(p.gacc[l], 0, sizeof(float) * (size_t)fan_out(net, l) * fan_in(net, l) * TILE);
    memset(p.gbacc[l], 0, sizeof(float) * (size_t)fan_out(net, l) * TILE);
  }
  double mask_sum = 0.0;
  for (int i = 0; i < nrows; ++i) mask_sum += row_mask_sum(bt, rows[i]);
  cursor c = {0, (long)nrows * bt->L, agg, 1.0 / (mask_sum > 1.0 ? mask_sum : 1.0),
              1.0 / ((double)nrows * bt->L), -1, 0.0};
  sums acc = {0.0, 0.0, 0.0, 0.0};
  while (fill(net, bt, rows, nrows, 0, &c, &p) > 0) {
    forward(net, &p);
    loss_grad(&p, log_std, eps_low, eps_high, &acc);
    backward(net, &p);
  }
  /* the lanes summed into the caller's gradients */
  double norm2 = acc.glog_std * acc.glog_std;
  for (int l = 0; l <= net->nhidden; ++l) {
    const size_t nw = (size_t)fan_out(net, l) * fan_in(net, l), nb = (size_t)fan_out(net, l);
    for (size_t i = 0; i < nw + nb; ++i) {
      const float *lane = i < nw ? p.gacc[l] + i * TILE : p.gbacc[l] + (i - nw) * TILE;
      float g = 0.0f;
      for (int k = 0; k < TILE; ++k) g += lane[k];
      if (i < nw)
        net->gW[l][i] = g;
      else
        net->gb[l][i - nw] = g;
      norm2 += (double)g * g;
    }
  }
  *grad_log_std = (float)acc.glog_std;
  const double norm = sqrt(norm2);
  if (max_grad_norm > 0.0 && max_grad_norm / (norm + 1e-6) < 1.0) {
    const float coef = (float)(max_grad_norm / (norm + 1e-6));
    for (int l = 0; l <= net->nhidden; ++l) {
      const size_t nw = (size_t)fan_out(net, l) * fan_in(net, l), nb = (size_t)fan_out(net, l);
      for (size_t i = 0; i < nw; ++i) net->gW[l][i] *= coef;
      for (size_t i = 0; i < nb; ++i) net->gb[l][i] *= coef;
    }
    *grad_log_std *= coef;
  }
  stats->loss = acc.loss;
  stats->mask_sum = mask_sum;
  stats->clipped_low = acc.low;
  stats->clipped_high = acc.high;
  stats->grad_norm = norm;
  return PU_OK;
}

int pu_mean(const pu_net *net, const pu_batch *bt, const int64_t *rows, int nrows, float *mu,
            float *work)
{
  if (!net_ok(net) || !batch_ok(bt, rows, nrows) || !mu || !work) return PU_ERR_ARGS;
  parts p;
  carve(net, line_aligned(work), &p);
  prepare(net, &p);
  cursor c = {0, (long)nrows * bt->L, PU_AGG_TOKEN, 0.0, 0.0, -1, 0.0};
  for (long first = 0;;) {
    const int count = fill(net, bt, rows, nrows, 1, &c, &p);
    if (count == 0) break;
    forward(net, &p);
    for (int s = 0; s < count; ++s) mu[first + s] = p.mu[s];
    first += count;
  }
  return PU_OK;
}

int pu_kl_old(const pu_net *net, const pu_batch *bt, const float *mu_old, const int64_t *rows,
              int nrows, double log_std_old, double log_std, double *kl, float *work)
{
  if (!net_ok(net) || !batch_ok(bt, rows, nrows) || !bt->mask || !mu_old || !kl || !work)
    return PU_ERR_ARGS;
  const double log_ratio = log_std_old - log_std, var_ratio = exp(2.0 * log_ratio),
               inv_var = exp(-2.0 * log_std);
  const int L = bt->L;
  parts p;
  carve(net, line_aligned(work), &p);
  prepare(net, &p);
  cursor c = {0, (long)nrows * L, PU_AGG_TOKEN, 0.0, 0.0, -1, 0.0};
  double sum = 0.0, weight = 0.0;
  for (long first = 0;;) {
    const int count = fill(net, bt, rows, nrows, 1, &c, &p);
    if (count == 0) break;
    forward(net, &p);
    for (int s = 0; s < count; ++s) {
      const long i = first + s;
      const size_t at = (size_t)rows[i / L] * L + (size_t)(i % L);
      const double d = (double)mu_old[at] - (double)p.mu[s], m = bt->mask[at];
      sum += (0.5 * (var_ratio + d * d * inv_var - 1.0) - log_ratio) * m;
      weight += m;
    }
    first += count;
  }
  *kl = sum / (weight > 1.0 ? weight : 1.0);
  return PU_OK;
}

/* log(1 + e^x) without overflow or loss of precision at either end. */
static double softplus(double x) { return (x > 0.0 ? x : 0.0) + log1p(exp(-fabs(x))); }

int pu_squashed_entropy(int B, int L, int first, int stride, const float *logp_old,
                        const float *z, const float *mask, double log_u_max, double *entropy)
{
  if (B < 1 || L < 1 || first < 0 || stride < 1 || !logp_old || !z || !mask || !entropy)
    return PU_ERR_ARGS;
  const double log_2 = 0.69314718055994530942;
  double sum = 0.0, weight = 0.0;
  for (int b = first; b < B; b += stride)
    for (int t = 0; t < L; ++t) {
      const size_t i = (size_t)b * L + t;
      const double zi = z[i], m = mask[i];
      /* log |du/dz| of u = u_max tanh(z): log u_max + 2 (log 2 - z - softplus(-2 z)) */
      const double log_jacobian = log_u_max + 2.0 * (log_2 - zi - softplus(-2.0 * zi));
      sum += ((double)logp_old[i] - log_jacobian) * m;
      weight += m;
    }
  *entropy = -sum / (weight > 1.0 ? weight : 1.0);
  return PU_OK;
}

/* Branch b's L loss steps of raw [L * B * nobs] normalised into obs [L * nobs]. Inlined
 * with nobs a constant for the plants' sizes: the inner loop then unrolls (2x faster). */
static inline void normalise_branch(int B, int L, int nobs, int b, const float *raw,
                                    const float *obs_mean, const float *obs_scale, float *obs)
{
  for (int t = 0; t < L; ++t) {
    const float *r = raw + ((size_t)t * B + b) * nobs;
    float *x = obs + (size_t)t * nobs;
    for (int k = 0; k < nobs; ++k) x[k] = (r[k] - obs_mean[k]) * obs_scale[k];
  }
}

int pu_loss_steps(int B, int L, const float *z, const float *mu, const uint8_t *alive,
                  const double *adv_branch, float saturated, float log_std, float inv_std,
                  float half_log_2pi, float *z_out, float *mu_out, float *logp_old, float *mask,
                  float *adv, int nobs, const float *raw, const float *obs_mean,
                  const float *obs_scale, float *obs)
{
  if (B < 1 || L < 1 || !z || !mu || !alive || !adv_branch || !z_out || !mu_out || !logp_old ||
      !mask || !adv || (obs && (nobs < 1 || !raw || !obs_mean || !obs_scale)))
    return PU_ERR_ARGS;
  /* branch by branch: the writes run along each branch's row, the reads of a step
   * stay in cache for the next branch */
  for (int b = 0; b < B; ++b) {
    const float a = (float)adv_branch[b];
    float *zo = z_out + (size_t)b * L, *muo = mu_out + (size_t)b * L;
    float *lp = logp_old + (size_t)b * L, *mk = mask + (size_t)b * L, *ad = adv + (size_t)b * L;
    for (int t = 0; t < L; ++t) {
      const size_t i = (size_t)t * B + b;
      const float u = (z[i] - mu[i]) * inv_std;
      zo[t] = z[i];
      muo[t] = mu[i];
      lp[t] = -0.5f * (u * u) - log_std - half_log_2pi;
      mk[t] = alive[i] ? 1.0f : 0.0f;
      ad[t] = fabsf(mu[i]) > saturated ? 0.0f : a;
    }
    if (!obs) continue;
    float *x = obs + (size_t)b * L * nobs;
    switch (nobs) {
      case 3: normalise_branch(B, L, 3, b, raw, obs_mean, obs_scale, x); break;
      case 5: normalise_branch(B, L, 5, b, raw, obs_mean, obs_scale, x); break;
      case 6: normalise_branch(B, L, 6, b, raw, obs_mean, obs_scale, x); break;
      default: normalise_branch(B, L, nobs, b, raw, obs_mean, obs_scale, x);
    }
  }
  return PU_OK;
}
