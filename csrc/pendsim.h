/*
 * pendsim: a batched, branchable pendulum simulator.
 *
 * The public interface of the C layer. It knows nothing of Python.
 *
 * As in MuJoCo, what does not change while simulating (sizes, nominal
 * parameters, integrator, task) lives in a ps_model; what does (the state of
 * B environments) lives in a ps_data. ps_step(m, d, ...) is the verb.
 *
 * Every array in ps_data is structure-of-arrays: component k of environment b
 * sits at [k * B + b]. The caller owns all memory (the Python layer hands in
 * numpy buffers); nothing here allocates.
 *
 * Angles are zero at upright for every plant. State is double precision;
 * actions and observations are float32, as in Gymnasium.
 */
#ifndef PENDSIM_H
#define PENDSIM_H

#include <stdint.h>

#define PS_MAX_NX 4       /* largest state dimension */
#define PS_MAX_NOBS 6     /* largest observation dimension */
#define PS_MAX_PARAMS 16  /* largest per-environment parameter vector */
#define PS_MAX_DELAY 32   /* longest actuation delay, in control steps */
#define PS_CATCH_BAND 3   /* the catch's blend: sqrt(v / catch_level) from 1 to this */

/* Plants. */
enum { PS_PENDULUM = 0, PS_CARTPOLE = 1, PS_FURUTA = 2, PS_DOUBLE_PENDULUM = 3,
       PS_NUM_SYSTEMS = 4 };

/* Integrators. EULER is explicit Euler (Gymnasium's CartPole); SEMI_EULER
 * updates velocities first and positions with the new velocities
 * (Gymnasium's Pendulum); RK4 is the classical fourth-order Runge-Kutta. */
enum { PS_EULER = 0, PS_SEMI_EULER = 1, PS_RK4 = 2 };

/* Reward kinds. QUADRATIC: r = -(sum_k w_x[k] * e_k^2 + w_u * u^2) on the
 * pre-step state, with angles wrapped to [-pi, pi) first. ALIVE: r = 1 for
 * every step taken (Gymnasium's CartPole). HEIGHT: the quadratic reward
 * minus w_height (1 - h), h the height of the plant's tip over its reach
 * (1 upright, -1 hanging; the double pendulum's end effector, the pole's
 * cos otherwise), minus w_down while h is below up_height, minus w_power
 * |u v|, v the driven joint's velocity (the motor's mechanical power). */
enum { PS_REWARD_QUADRATIC = 0, PS_REWARD_ALIVE = 1, PS_REWARD_HEIGHT = 2 };

/* Per-environment parameter indices, one list per plant (SI units).
 * Pendulum: a body of mass m and length l pivoted at one end, its centre of
 * mass at lc = com l from the pivot, its inertia about the pivot
 * J = inertia m l^2 (com and inertia are dimensionless shape factors):
 *   thdd = (m g lc sin(th) + u - b thd - fc s(thd)) / J,
 *   s(v) = tanh(v / coulomb_vc), or sign(v) when coulomb_vc is 0.
 * A uniform rod is com = 1/2, inertia = 1/3 (Gymnasium's Pendulum-v1); a
 * point mass on a massless rod is com = inertia = 1 (RealAIGym's). */
enum {
  PS_PEND_G, PS_PEND_M, PS_PEND_L, PS_PEND_B, PS_PEND_FC, PS_PEND_COM, PS_PEND_INERTIA,
  PS_PEND_NPARAM
};
/* Cart-pole (Barto, Sutton and Anderson 1983; Florian 2007, frictionless as
 * in Gymnasium): cart mass mc, pole mass mp, pole half-length l. */
enum { PS_CP_G, PS_CP_MC, PS_CP_MP, PS_CP_L, PS_CP_NPARAM };
/* Furuta pendulum driven by a DC motor (Quanser Qube-Servo 2 model): motor
 * resistance rm, torque/back-EMF constant km, arm mass mr and length lr,
 * arm inertia jr, arm damping dr, pendulum mass mp, length lp, inertia jp
 * about its centre, damping dp. */
enum {
  PS_FU_G, PS_FU_RM, PS_FU_KM, PS_FU_MR, PS_FU_LR, PS_FU_JR, PS_FU_DR,
  PS_FU_MP, PS_FU_LP, PS_FU_JP, PS_FU_DP, PS_FU_NPARAM
};
/* Double pendulum (RealAIGym's acrobot and pendubot; plant_double.h has
 * the equations): link masses m1, m2, lengths l1, l2, centres of mass r1, r2
 * from the joints, inertias I1, I2 about the joint axes, viscous b1, b2 and
 * Coulomb cf1, cf2 friction of the joints, rotor inertia Ir and gear ratio
 * gr of the motor(s). */
enum {
  PS_DP_G, PS_DP_M1, PS_DP_M2, PS_DP_L1, PS_DP_L2, PS_DP_R1, PS_DP_R2, PS_DP_I1, PS_DP_I2,
  PS_DP_B1, PS_DP_B2, PS_DP_CF1, PS_DP_CF2, PS_DP_IR, PS_DP_GR, PS_DP_NPARAM
};

/* How each environment's plant is chosen at reset (ps_reset and autoreset).
 * NOMINAL: the model's parameters and delay, an ideal actuator and sensors
 *   without offset (the presets; the per-environment plant arrays of ps_data
 *   are not touched and may be NULL).
 * DRAW: a new plant drawn from the model's ranges (ps_plant_ranges) with
 *   the environment's RNG, before its start state.
 * HOLD: the plant already in ps_data stays (set by the caller, e.g. many
 *   candidate parameter sets scored at once); only the state is reset. */
enum { PS_PLANT_NOMINAL = 0, PS_PLANT_DRAW = 1, PS_PLANT_HOLD = 2 };

/* Ranges of a drawn plant. Each quantity is drawn uniformly from [lo, hi]
 * per environment at reset; lo == hi fixes it.
 * The actuator between the policy and the plant, in this order:
 *   u_d   = the command from `delay` steps ago, saturated to +-u_max
 *   tau   = tau + motor_k (u_d - tau)      (first-order motor response;
 *                                          motor_k = 1: instant)
 *   input = tau + torque_noise * N(0, 1) + push
 * A push starts in each step with probability push_rate * dt, lasts
 * push_steps control steps and has a magnitude in [push_lo, push_hi] with
 * a random sign (in action units: N m, N or V). The quadratic reward's
 * action term sees u_d, what the policy asked for.
 * The sensors read angle/position component k (k < nx / 2) as
 * x_k + offset_k, then add noise_std[k] noise, then quantise. */
typedef struct {
  double param_lo[PS_MAX_PARAMS], param_hi[PS_MAX_PARAMS]; /* absolute values */
  int delay_lo, delay_hi;               /* control steps, 0..PS_MAX_DELAY */
  double motor_k_lo, motor_k_hi;        /* (0, 1] */
  double torque_noise_lo, torque_noise_hi; /* std, action units */
  double offset_lo[PS_MAX_NX / 2], offset_hi[PS_MAX_NX / 2]; /* rad or m */
  double push_rate;                     /* pushes per second */
  double push_lo, push_hi;              /* magnitude, action units */
  int push_steps;                       /* duration of one push, >= 1 */
} ps_plant_ranges;

/* What does not change while simulating. Fill it with ps_model_init and
 * adjust fields before the first step if you must. */
typedef struct {
  int system;               /* PS_PENDULUM, ..., PS_DOUBLE_PENDULUM */
  int nx;                   /* state dimension */
  int nobs;                 /* observation dimension */
  int nparam;               /* per-environment parameter count */
  double dt;                /* control period, s */
  int substeps;             /* integration steps per control period */
  int integrator;           /* PS_EULER, PS_SEMI_EULER, PS_RK4 */
  double param[PS_MAX_PARAMS];    /* nominal parameters (ps_reset copies them) */
  double u_max;             /* actuator saturation, |u| <= u_max */
  double v_max;             /* clip on angular velocities, 0 = none */
  int delay;                /* actuation delay in control steps, 0..PS_MAX_DELAY */
  int gym_precision;        /* 1: compute action terms in float32, as
                               Gymnasium's Pendulum does under NumPy 2 */
  double coulomb_vc;        /* velocity scale of the smoothed Coulomb term;
                               0: the exact sign of the velocity */
  int actuated;             /* double pendulum: the joint the motor drives,
                               0 shoulder (pendubot), 1 elbow (acrobot) */
  /* task */
  int reward_kind;
  double w_x[PS_MAX_NX];    /* quadratic state weights */
  double w_u;               /* quadratic action weight */
  double w_height;          /* PS_REWARD_HEIGHT's weight */
  double w_down;            /* PS_REWARD_HEIGHT: cost of a step begun with the
                               tip below up_height (a leaderboard's "up") */
  double up_height;         /* in units of the reach, as h */
  double w_power;           /* PS_REWARD_HEIGHT: weight of |u v| */
  /* a linear controller that catches the plant near its goal: where the
   * state e (angles wrapped to [-pi, pi)) has v = e' catch_P e below
   * catch_level, the command is clip(-catch_K e) in place of the action;
   * above PS_CATCH_BAND^2 catch_level the action; between, a blend linear in
   * sqrt(v). Then delayed and saturated as any command. 0: never */
  double catch_level;
  double catch_K[PS_MAX_NX];
  double catch_P[PS_MAX_NX * PS_MAX_NX]; /* row-major, nx by nx */
  double term_limit[PS_MAX_NX]; /* terminate when |x_k| > limit (0 = none) */
  double term_reward;       /* added to the reward of a terminating step */
  int max_steps;            /* truncate after this many steps (0 = never) */
  double x0_low[PS_MAX_NX], x0_high[PS_MAX_NX]; /* uniform start box */
  /* sensors */
  double enc_counts[PS_MAX_NX]; /* encoder counts per revolution of each
                                   angle, 0 = no quantisation */
  double noise_std[PS_MAX_NX];  /* Gaussian noise on each state component
                                   before it is observed */
  /* the plant of each environment: nominal, drawn, or held (see above) */
  int plant_mode;               /* PS_PLANT_NOMINAL, PS_PLANT_DRAW, PS_PLANT_HOLD */
  ps_plant_ranges ranges;       /* used by PS_PLANT_DRAW */
} ps_model;

/* The mutable state of B environments, caller-owned, structure-of-arrays. */
typedef struct {
  int B;
  double *x;          /* [nx * B] state */
  double *param;      /* [nparam * B] per-environment parameters */
  float *act_buf;     /* [PS_MAX_DELAY * B] pending actions, oldest first */
  uint64_t *rng_key;  /* [B] counter-based RNG: key ... */
  uint64_t *rng_ctr;  /* [B] ... and counter */
  int32_t *t;         /* [B] steps since reset */
  /* Each environment's plant beyond its parameters, and the actuator's
   * state: used unless plant_mode is PS_PLANT_NOMINAL (then may be NULL). */
  int32_t *delay;     /* [B] actuation delay, control steps */
  double *motor_k;    /* [B] first-order motor response per step */
  double *torque_noise; /* [B] std of the actuator noise */
  double *offset;     /* [nx / 2 * B] sensor offset of each position */
  double *tau;        /* [B] the motor's output now */
  double *push;       /* [B] the push acting now */
  int32_t *push_left; /* [B] steps the push still acts */
} ps_data;

/* Error codes. */
enum {
  PS_OK = 0,
  PS_ERR_SYSTEM = 1,      /* unknown system */
  PS_ERR_PRESET = 2,      /* unknown preset for that system */
  PS_ERR_NONFINITE = 3,   /* an action was NaN or infinite */
  PS_ERR_INDEX = 4,       /* an environment index out of range */
  PS_ERR_MODEL = 5,       /* a model field out of range */
  PS_ERR_DATA = 6         /* a ps_data array the model needs is NULL */
};

/* Names: system and preset lookup. Returns PS_OK or an error code. */
int ps_system_id(const char *name);            /* -1 if unknown */
const char *ps_system_name(int system);
int ps_num_presets(int system);
const char *ps_preset_name(int system, int k);
int ps_model_init(ps_model *m, int system, const char *preset);
int ps_model_check(const ps_model *m);
/* PS_OK, or PS_ERR_DATA if d lacks an array that m needs. */
int ps_data_check(const ps_model *m, const ps_data *d);
const char *ps_param_name(int system, int k);
const char *ps_obs_name(int system, int k);
const char *ps_state_name(int system, int k);

/* Reset the environments whose mask byte is nonzero (mask NULL: all):
 * the plant as plant_mode says (nominal, drawn from the ranges with the
 * environment's RNG, or held), then the state drawn from the start box with
 * the environment's RNG, delay buffer, motor and push zeroed, t = 0. Writes their observation
 * into obs [B * nobs] when obs is not NULL. */
void ps_reset(const ps_model *m, ps_data *d, const uint8_t *mask, float *obs);

/* Set the RNG key of environment b to a hash of seed[b], counter to zero. */
void ps_seed(ps_data *d, const uint64_t *seed);

/* Observation [B * nobs] (row-major) of the current state. Draws sensor
 * noise from each environment's RNG when the model has any. */
void ps_observe(const ps_model *m, ps_data *d, float *obs);

/* One control step of all B environments. action: [B * nu] (nu = 1).
 * Writes obs [B * nobs], reward [B], terminated [B], truncated [B]; obs,
 * reward and final_obs may be NULL, the episode flags may not
 * (PS_ERR_MODEL). If autoreset is nonzero, environments that ended are
 * reset after their outputs are written, and obs holds the reset
 * observation (final_obs, if not NULL, keeps the last one).
 * Returns PS_ERR_NONFINITE without touching the state if any action is NaN
 * or infinite. */
int ps_step(const ps_model *m, ps_data *d, const float *action, float *obs,
            double *reward, uint8_t *terminated, uint8_t *truncated,
            int autoreset, float *final_obs);

/* K steps of all B environments: actions [K * B], obs [K * B * nobs],
 * reward/terminated/truncated [K * B]. Equivalent to K calls of ps_step
 * (obs and reward may be NULL). */
int ps_rollout(const ps_model *m, ps_data *d, int K, const float *actions,
               float *obs, double *reward, uint8_t *terminated,
               uint8_t *truncated, int autoreset);

/* Copy the full state (x, param, delay buffer, RNG, t, and the plant
 * arrays when both have them) of environment
 * src_idx[i] of src into environment dst_idx[i] of dst, i < n. src and dst
 * must not be the same ps_data. Branching a group of G is src_idx repeated G
 * times. Returns PS_ERR_INDEX without copying if any index is out of range. */
int ps_copy_envs(const ps_model *m, ps_data *dst, const int32_t *dst_idx,
                 const ps_data *src, const int32_t *src_idx, int n);

/* Continuous-time dynamics of environment b: xdot = f(x, u). */
void ps_dynamics(const ps_model *m, const ps_data *d, int b, const double *x,
                 double u, double *xdot);

/* Total mechanical energy of environment b at state x (J), zero hanging
 * at rest for the pendulums. */
double ps_energy(const ps_model *m, const ps_data *d, int b, const double *x);

#endif /* PENDSIM_H */
