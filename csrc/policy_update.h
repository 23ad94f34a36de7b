/*
 * policy_update: the gradient of GRPO's clipped-ratio loss in C.
 *
 * One minibatch of GRPO's update is a forward pass of the policy's mean
 * network over a few thousand loss steps, the clipped surrogate, and the
 * backward pass. Done through torch autograd, most of its ~2.3 ms goes to
 * per-call costs around small matrix products (docs/grpo.md §9, thirteenth
 * pass); here the forward pass, the loss's gradient and the backward pass run
 * chunk by chunk, each chunk's activations staying in cache, and every
 * parameter's gradient is written into the caller's arrays (torch's .grad).
 *
 * The network is GaussianPolicy's mean (grpo_ctrl/policy.py), taking
 * observations already normalised: optionally random Fourier features
 * [sin(x B + b), x] (B fixed, not trained), ReLU hidden layers of one width,
 * a linear output; the std is one learned number, exp(log_std). The loss per
 * step is PPO's clipped surrogate of the ratio pi / pi_old at the step's
 * pre-squash action z,
 *     -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A),
 * averaged as aggregate_loss (grpo_ctrl/grpo.py) does. Nothing allocates.
 */
#ifndef POLICY_UPDATE_H
#define POLICY_UPDATE_H

#include <stddef.h>
#include <stdint.h>

/* Hidden layers at most. */
#define PU_MAX_HIDDEN 6

/* Return codes (pendsim.h's PS_OK and PS_ERR_MODEL, kept apart so this file
 * stands alone). */
#define PU_OK 0
#define PU_ERR_ARGS (-1)

/* How the per-step losses are averaged (aggregate_loss): over all masked
 * steps; over each branch's steps and then over branches; summed over steps
 * / (branches * steps). */
#define PU_AGG_TOKEN 0
#define PU_AGG_GRPO 1
#define PU_AGG_DR_GRPO 2

/* The network, in torch's layouts: layer l < nhidden is the l-th hidden
 * Linear, layer nhidden the output; W[l] is its weight [out * in] row-major,
 * b[l] its bias [out]. The first hidden layer's input is [sin(x B + b), x]
 * (nfeat + nobs wide) with features, x without. gW and gb receive the
 * gradients, the same shapes; they are overwritten. */
typedef struct {
  int nobs;      /* observation size, >= 1 */
  int nfeat;     /* random Fourier features, 0 = none */
  int nhidden;   /* hidden layers, 1..PU_MAX_HIDDEN */
  int width;     /* units of each hidden layer, >= 1 */
  const float *feat_B;  /* [nobs * nfeat]: FourierFeatures.B, row-major (NULL if nfeat = 0) */
  const float *feat_b;  /* [nfeat] */
  const float *W[PU_MAX_HIDDEN + 1];
  const float *b[PU_MAX_HIDDEN + 1];
  float *gW[PU_MAX_HIDDEN + 1];
  float *gb[PU_MAX_HIDDEN + 1];
} pu_net;

/* A batch of branches, each of L loss steps: every array row-major, row r of
 * a [B * L] array is branch r's steps. */
typedef struct {
  int B, L;
  const float *obs;       /* [B * L * nobs] normalised observations */
  const float *z;         /* [B * L] pre-squash actions taken */
  const float *logp_old;  /* [B * L] their log-density under pi_old */
  const float *adv;       /* [B * L] advantages */
  const float *mask;      /* [B * L] 1 where the step is in the loss, else 0 */
} pu_batch;

/* What a gradient call saw: the loss, the masked steps' count, the steps
 * the clip stopped (A < 0 and r < 1 - eps_low; A > 0 and r > 1 + eps_high),
 * and the gradient's norm over every parameter and log_std before clipping. */
typedef struct {
  double loss;
  double mask_sum;
  double clipped_low;
  double clipped_high;
  double grad_norm;
} pu_stats;

/* Floats of workspace pu_gradient and pu_mean need, at any float's address (they start
 * their parts on a cache line within it). 0 for a malformed net. */
size_t pu_work_size(const pu_net *net);

/* The gradient of the loss over branches rows[0..nrows) of the batch with
 * respect to every weight and bias (into net's gW, gb) and to log_std (into
 * *grad_log_std). agg: PU_AGG_*. max_grad_norm > 0 scales every gradient by
 * min(1, max_grad_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_
 * does; 0 leaves them as they are. Returns PU_OK or PU_ERR_ARGS (a malformed
 * net or batch, a row out of range). */
int pu_gradient(const pu_net *net, float log_std, const pu_batch *batch, const int64_t *rows,
                int nrows, int agg, float eps_low, float eps_high, double max_grad_norm,
                float *grad_log_std, pu_stats *stats, float *work);

/* The network's output (the Gaussian's mean) at every step of branches
 * rows[0..nrows): mu [nrows * L], in that order. */
int pu_mean(const pu_net *net, const pu_batch *batch, const int64_t *rows, int nrows, float *mu,
            float *work);

/* KL(pi_old || pi) averaged over the masked steps of branches rows[0..nrows)
 * (grpo_ctrl/grpo.py, update_kl: gaussian_kl's masked mean): pi the network now
 * with log std log_std, pi_old the batch's means mu_old [B * L] with log std
 * log_std_old. In double: per step
 *   0.5 (var_ratio + (mu_old - mu)^2 / sigma^2 - 1) - log_ratio,
 * var_ratio = sigma_old^2 / sigma^2, log_ratio = log sigma_old - log sigma; the
 * masked sum over the mask's sum (at least 1) into *kl. Returns PU_OK or
 * PU_ERR_ARGS. */
int pu_kl_old(const pu_net *net, const pu_batch *batch, const float *mu_old, const int64_t *rows,
              int nrows, double log_std_old, double log_std, double *kl, float *work);

/* The Monte-Carlo entropy of the command u_max tanh(z) (grpo_ctrl/grpo.py,
 * squashed_entropy): -E[log pi(a)] = -E[logp_old - log |du/dz|] over the masked
 * steps of branches b = first, first + stride, ... below B, logp_old, z and mask
 * [B * L] the batch's; in double, into *entropy. Returns PU_OK or PU_ERR_ARGS. */
int pu_squashed_entropy(int B, int L, int first, int stride, const float *logp_old,
                        const float *z, const float *mask, double log_u_max, double *entropy);

/* A rollout's loss steps in pu_batch's layout (GroupRollout.collect): from
 * pr_rollout's step-major arrays (decision t of branch b at [t * B + b]), the
 * first L decisions of each of the B branches, branch-major ([b * L + t]):
 *   z_out, mu_out  z and mu, copied
 *   logp_old       log N(z; mu, sigma^2), rounded as gaussian_log_prob
 *                  (grpo_ctrl/policy.py) rounds it, one float32 operation at a
 *                  time: -0.5 ((z - mu) inv_std)^2 - log_std - half_log_2pi
 *   mask           1 where alive[t * B + b] (0 or 1) is set, else 0
 *   adv            the branch's advantage adv_branch[b] as float, 0 where
 *                  |mu| > saturated (INFINITY: never)
 *   obs            (raw - obs_mean) * obs_scale, [B * L * nobs] from raw
 *                  [L * B * nobs] (NULL: not made)
 * Returns PU_OK or PU_ERR_ARGS (a size below 1, a missing array). */
int pu_loss_steps(int B, int L, const float *z, const float *mu, const uint8_t *alive,
                  const double *adv_branch, float saturated, float log_std, float inv_std,
                  float half_log_2pi, float *z_out, float *mu_out, float *logp_old, float *mask,
                  float *adv, int nobs, const float *raw, const float *obs_mean,
                  const float *obs_scale, float *obs);

#endif /* POLICY_UPDATE_H */
