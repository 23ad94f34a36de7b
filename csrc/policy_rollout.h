/*
 * policy_rollout: a training rollout with the policy's mean network in C.
 *
 * GRPO's rollout alternates a forward pass of the policy over a batch of B
 * environments with one simulator step. Done from Python, every step pays
 * torch's per-call cost a dozen times over (~100 us a step at B = 256,
 * docs/grpo.md §9, eleventh pass); here the network, the noise, the squash
 * and the simulator run in one loop.
 *
 * The network is GaussianPolicy's mean (grpo_ctrl/policy.py): the observation
 * normalised, optionally random Fourier features [sin(x F + f), x], ReLU
 * hidden layers of one width, a linear output. Its weights are copied into
 * one caller-owned array in torch's order and layout; nothing here allocates.
 * Activations are structure-of-arrays (unit k of environment b at
 * [k * stride + b]), so each layer is a batch of axpys that vectorise.
 */
#ifndef POLICY_ROLLOUT_H
#define POLICY_ROLLOUT_H

#include <stddef.h>
#include <stdint.h>

#include "pendsim.h"

/* The mean network. params holds, one after the other:
 *   obs_mean [nobs], obs_scale [nobs]   (x = (obs - mean) * scale)
 *   feat_W [nfeat * nobs] (row-major: FourierFeatures.B transposed), feat_b [nfeat]
 *                                        (if nfeat > 0)
 *   then per layer, hidden ones first and the output last:
 *   W [out * in] (row-major, torch's nn.Linear.weight), b [out]
 * The first hidden layer's input is [sin(feat_W x + feat_b), x] with
 * features (nfeat + nobs wide), x without; every hidden layer is `width`
 * wide and followed by ReLU; the output layer has one unit. */
typedef struct {
  int nobs;      /* observation size, 1..PS_MAX_NOBS */
  int nfeat;     /* random Fourier features, 0 = none */
  int nhidden;   /* hidden layers, >= 1 */
  int width;     /* units of each hidden layer, >= 1 */
  const float *params;
} pr_net;

/* Floats in a network's params array. */
size_t pr_net_num_params(const pr_net *net);

/* Floats of workspace pr_mean and pr_rollout need for B environments, at any float's
 * address (they start their parts on a cache line within it). */
size_t pr_work_size(const pr_net *net, int B);

/* The network's output (the Gaussian's mean, before the squash) for B
 * observations obs [B * nobs], row-major as the simulator writes them,
 * into mu [B]. Returns PS_OK, or PS_ERR_MODEL for a malformed network. */
int pr_mean(const pr_net *net, int B, const float *obs, float *mu, float *work);

/* The moments RunningNorm folds in, of `rows` observations x [rows * n]
 * (row-major float32): out = [rows, the mean (n), the biased variance (n)],
 * in double, by two passes (the mean, then the squared deviations from it),
 * each summing a column in four interleaved partial sums. Returns PS_OK, or
 * PS_ERR_MODEL for rows < 1, n < 1 or a NULL pointer. */
int pr_moments(const float *x, long rows, int n, double *out);

/* `steps` decisions of all environments of d, continuing from obs [B * nobs]
 * (their current observation; on return, the last one). Decision t:
 *   raw[t]   = the observation           [steps * B * nobs]
 *   mu[t]    = pr_mean of it              [steps * B]
 *   z[t]     = mu[t] + spread[t]          [steps * B]  (the scaled noise)
 *   a        = u_max * tanh(z[t]), held for `repeat` simulator steps
 *   reward[t] = sum of the step rewards while alive, minus, when w_du > 0
 *              and a previous command is known (t > 0 or have_last),
 *              w_du ((a - last_act) / u_max)^2 if alive at t
 *   last_act = a                           [B]
 *   alive[t + 1] = alive[t] and no step so far terminated   [(steps + 1) * B]
 * act, step_reward, terminated and truncated are [B] scratch buffers (the
 * simulator's own output buffers will do). A branch that ended earns
 * nothing more, as in GroupRollout._roll. Returns PS_OK, PS_ERR_MODEL, or
 * the simulator's error (PS_ERR_NONFINITE: the network gave a NaN). */
int pr_rollout(const ps_model *m, ps_data *d, const pr_net *net, int steps, int repeat,
               int autoreset, double u_max, double w_du, const float *spread, float *obs,
               float *raw, float *mu, float *z, double *reward, uint8_t *alive,
               float *last_act, int have_last, float *act, double *step_reward, uint8_t *terminated,
               uint8_t *truncated, float *work);

#endif /* POLICY_ROLLOUT_H */
