/*
 * The plants: equations of motion, energies, names and parameter presets.
 *
 * Conventions shared by every plant: angles are zero at upright and grow
 * counter-clockwise; the action u is one float (torque, force or voltage).
 */
#include "plants.h"

#include <math.h>
#include <string.h>

#include "plant_layout.h"

#define PI 3.14159265358979323846 /* a macro: the layout tables are static initialisers */

#include "plant_double.h" /* the double pendulum's equations and presets */

/* ------------------------------------------------------------------------
 * Pendulum. State [th, thd], observation [cos th, sin th, thd], th zero
 * upright and growing counter-clockwise.
 * A body of mass m and length l on a pivot, its centre of mass at
 * lc = com l, its inertia about the pivot J = inertia m l^2, under gravity,
 * a motor torque u, viscous friction b and Coulomb friction fc:
 *   thdd = (m g lc sin th + u - b thd - fc s(thd)) / J
 * with s(v) = tanh(v / vc) (a continuous right-hand side for RK4) or, when
 * the model's coulomb_vc is 0, the exact sign of v (RealAIGym's).
 * Written as a (2 com) g / (2 l) sin th + a / (m l^2) (u - friction) with
 * a = m l^2 / J = 1 / inertia: for the uniform rod (com = 1/2, inertia =
 * 1/3, a = 3 exactly) the same operations as Gymnasium's Pendulum-v1, which
 * this is when b = fc = 0.
 * ---------------------------------------------------------------------- */
static double coulomb_shape(const ps_model *m, double v)
{
  if (m->coulomb_vc > 0) return tanh(v / m->coulomb_vc);
  return (double)((v > 0) - (v < 0));
}

static void pendulum_f(const ps_model *m, const double *p, const double *x,
                       double u, double *xdot)
{
  const double g = p[PS_PEND_G], mass = p[PS_PEND_M], l = p[PS_PEND_L];
  const double a = 1.0 / p[PS_PEND_INERTIA];
  const double friction = p[PS_PEND_B] * x[1] + p[PS_PEND_FC] * coulomb_shape(m, x[1]);
  xdot[0] = x[1];
  xdot[1] = a * (2.0 * p[PS_PEND_COM]) * g / (2 * l) * sin(x[0]) +
            a / (mass * l * l) * (u - friction);
}

/* Height of the centre of mass above hanging, times m g, plus rotational
 * kinetic energy about the pivot. */
static double pendulum_energy(const double *p, const double *x)
{
  const double g = p[PS_PEND_G], mass = p[PS_PEND_M], l = p[PS_PEND_L];
  const double lc = p[PS_PEND_COM] * l, J = p[PS_PEND_INERTIA] * mass * l * l;
  return 0.5 * J * x[1] * x[1] + mass * g * lc * (1.0 + cos(x[0]));
}

/* ------------------------------------------------------------------------
 * Cart-pole. State [x, xd, th, thd], observation [x, xd, cos th, sin th, thd].
 * The frictionless equations of Gymnasium's CartPole-v1 (Florian 2007),
 * with l the pole's half-length and force u on the cart:
 *   temp = (u + mp l thd^2 sin th) / (mc + mp)
 *   thdd = (g sin th - cos th temp) / (l (4/3 - mp cos^2 th / (mc + mp)))
 *   xdd  = temp - mp l thdd cos th / (mc + mp)
 * Written in Gymnasium's order of operations so the gym preset matches it
 * bit for bit. (Gymnasium's theta grows clockwise; so does ours here.)
 * ---------------------------------------------------------------------- */
static void cartpole_f(const double *p, const double *x, double u, double *xdot)
{
  const double g = p[PS_CP_G], mc = p[PS_CP_MC], mp = p[PS_CP_MP], l = p[PS_CP_L];
  const double total_mass = mp + mc, polemass_length = mp * l;
  const double c = cos(x[2]), s = sin(x[2]);
  const double temp = (u + polemass_length * (x[3] * x[3]) * s) / total_mass;
  const double thetaacc =
      (g * s - c * temp) / (l * (4.0 / 3.0 - mp * (c * c) / total_mass));
  const double xacc = temp - polemass_length * thetaacc * c / total_mass;
  xdot[0] = x[1];
  xdot[1] = xacc;
  xdot[2] = x[3];
  xdot[3] = thetaacc;
}

static double cartpole_energy(const double *p, const double *x)
{
  const double g = p[PS_CP_G], mc = p[PS_CP_MC], mp = p[PS_CP_MP], l = p[PS_CP_L];
  const double c = cos(x[2]), s = sin(x[2]);
  /* pole centre velocity: cart velocity plus rotation about the hinge;
   * theta grows clockwise, so the centre sits at (x + l sin th, l cos th) */
  const double vx = x[1] + l * c * x[3], vy = -l * s * x[3];
  return 0.5 * mc * x[1] * x[1] + 0.5 * mp * (vx * vx + vy * vy) +
         0.5 * (mp * l * l / 3.0) * x[3] * x[3] + mp * g * l * (1.0 + c);
}

/* ------------------------------------------------------------------------
 * Furuta pendulum (Quanser Qube-Servo 2). State [th, al, thd, ald]: arm
 * angle th, pendulum angle al (zero upright). Observation
 * [cos th, sin th, cos al, sin al, thd, ald]. Input: motor voltage V.
 * Lagrange's equations for a rod pendulum of mass mp and length lp whose
 * pivot sits on an arm of length lr (Quanser's courseware; Cazzolato and
 * Prime 2011 with the pendulum's axial inertia neglected):
 *   M(al) [thdd, aldd]' = [tau - dr thd - c1, -dp ald - c2]'
 *   M11 = jr + mp lr^2 + mp lp^2 / 4 sin^2 al,  M12 = -mp lp lr / 2 cos al,
 *   M22 = jp + mp lp^2 / 4,
 *   c1  = mp lp^2 / 2 sin al cos al thd ald + mp lp lr / 2 sin al ald^2,
 *   c2  = -mp lp^2 / 4 sin al cos al thd^2 - mp g lp / 2 sin al,
 *   tau = km (V - km thd) / rm  (back-EMF; the torque and EMF constants are
 *   equal in SI units).
 * ---------------------------------------------------------------------- */
static void furuta_f(const double *p, const double *x, double u, double *xdot)
{
  const double g = p[PS_FU_G], rm = p[PS_FU_RM], km = p[PS_FU_KM];
  const double lr = p[PS_FU_LR], jr = p[PS_FU_JR], dr = p[PS_FU_DR];
  const double mp = p[PS_FU_MP], lp = p[PS_FU_LP], jp = p[PS_FU_JP], dp = p[PS_FU_DP];
  const double thd = x[2], ald = x[3];
  const double s = sin(x[1]), c = cos(x[1]);
  const double m11 = jr + mp * lr * lr + 0.25 * mp * lp * lp * s * s;
  const double m12 = -0.5 * mp * lp * lr * c;
  const double m22 = jp + 0.25 * mp * lp * lp;
  const double tau = km * (u - km * thd) / rm;
  const double r1 = tau - dr * thd - 0.5 * mp * lp * lp * s * c * thd * ald -
                    0.5 * mp * lp * lr * s * ald * ald;
  const double r2 = -dp * ald + 0.25 * mp * lp * lp * s * c * thd * thd +
                    0.5 * mp * g * lp * s;
  const double det = m11 * m22 - m12 * m12;
  xdot[0] = thd;
  xdot[1] = ald;
  xdot[2] = (m22 * r1 - m12 * r2) / det;
  xdot[3] = (m11 * r2 - m12 * r1) / det;
}

static double furuta_energy(const double *p, const double *x)
{
  const double g = p[PS_FU_G], lr = p[PS_FU_LR], jr = p[PS_FU_JR];
  const double mp = p[PS_FU_MP], lp = p[PS_FU_LP], jp = p[PS_FU_JP];
  const double s = sin(x[1]), c = cos(x[1]), thd = x[2], ald = x[3];
  const double m11 = jr + mp * lr * lr + 0.25 * mp * lp * lp * s * s;
  const double m12 = -0.5 * mp * lp * lr * c;
  const double m22 = jp + 0.25 * mp * lp * lp;
  const double kinetic = 0.5 * (m11 * thd * thd + 2.0 * m12 * thd * ald + m22 * ald * ald);
  return kinetic + 0.5 * mp * g * lp * (1.0 + c);
}

void plant_dynamics(const ps_model *m, const double *p, const double *x, double u,
                    double *xdot)
{
  switch (m->system) {
  case PS_PENDULUM: pendulum_f(m, p, x, u, xdot); break;
  case PS_CARTPOLE: cartpole_f(p, x, u, xdot); break;
  case PS_DOUBLE_PENDULUM: double_pendulum_f(m, p, x, u, xdot); break;
  default: furuta_f(p, x, u, xdot); break;
  }
}

double plant_energy(const ps_model *m, const double *p, const double *x)
{
  switch (m->system) {
  case PS_PENDULUM: return pendulum_energy(p, x);
  case PS_CARTPOLE: return cartpole_energy(p, x);
  case PS_DOUBLE_PENDULUM: return double_pendulum_energy(p, x);
  default: return furuta_energy(p, x);
  }
}

double plant_driven_velocity(const ps_model *m, const double *x)
{
  switch (m->system) {
  case PS_PENDULUM: return x[1];
  case PS_CARTPOLE: return x[1];
  case PS_DOUBLE_PENDULUM: return x[2 + m->actuated];
  default: return x[2];
  }
}

double plant_height(const ps_model *m, const double *p, const double *x)
{
  switch (m->system) {
  case PS_PENDULUM: return cos(x[0]);
  case PS_CARTPOLE: return cos(x[2]);
  case PS_DOUBLE_PENDULUM: return double_pendulum_height(p, x);
  default: return cos(x[1]);
  }
}

/* ------------------------------------------------------------------------
 * Layouts (plant_layout.h): what the rest of the project knows of a plant.
 * ---------------------------------------------------------------------- */
static const ps_layout LAYOUTS[PS_NUM_SYSTEMS] = {
    [PS_PENDULUM] = {
        .action_name = "torque", .action_unit = "N*m",
        .state_unit = {"rad", "rad/s"},
        .obs_unit = {"1", "1", "rad/s"},
        .param_unit = {"m/s^2", "kg", "m", "N*m*s/rad", "N*m", "l", "m*l^2"},
        .is_angle = {1, 0}, .is_angular_velocity = {0, 1},
        .obs_index = {0, 2}, .cyclic = {0, 0},
        .pole_angle = 0, .pole_velocity = 1,
        .operating_range = {PI, 8.0},
        .n_channels = 1, .channel_position = {0}, .channel_velocity = {1},
        .channel_pos_limit = {0.0}, .channel_vel_limit = {30.0}},
    [PS_CARTPOLE] = {
        .action_name = "force", .action_unit = "N",
        .state_unit = {"m", "m/s", "rad", "rad/s"},
        .obs_unit = {"m", "m/s", "1", "1", "rad/s"},
        .param_unit = {"m/s^2", "kg", "kg", "m"},
        .is_angle = {0, 0, 1, 0}, .is_angular_velocity = {0, 0, 0, 1},
        .obs_index = {0, 1, 2, 4}, .cyclic = {1, 0, 0, 0},
        .pole_angle = 2, .pole_velocity = 3,
        /* swing-up speeds on a 2.4 m half-track */
        .operating_range = {2.4, 5.0, PI, 15.0},
        .n_channels = 2, .channel_position = {0, 2}, .channel_velocity = {1, 3},
        .channel_pos_limit = {2.4, 0.0}, .channel_vel_limit = {0.0, 0.0}},
    [PS_FURUTA] = {
        .action_name = "voltage", .action_unit = "V",
        .state_unit = {"rad", "rad", "rad/s", "rad/s"},
        .obs_unit = {"1", "1", "1", "1", "rad/s", "rad/s"},
        .param_unit = {"m/s^2", "ohm", "N*m/A", "kg", "m", "kg*m^2", "N*m*s/rad", "kg", "m",
                       "kg*m^2", "N*m*s/rad"},
        .is_angle = {1, 1, 0, 0}, .is_angular_velocity = {0, 0, 1, 1},
        .obs_index = {0, 2, 4, 5}, .cyclic = {1, 0, 0, 0},
        .pole_angle = 1, .pole_velocity = 3,
        /* what a Qube-Servo 2 arm and pendulum reach while swinging */
        .operating_range = {PI, PI, 25.0, 40.0},
        /* the arm kept within the encoder cable's reach */
        .n_channels = 2, .channel_position = {0, 1}, .channel_velocity = {2, 3},
        .channel_pos_limit = {2.0, 0.0}, .channel_vel_limit = {0.0, 0.0}},
    [PS_DOUBLE_PENDULUM] = {
        .action_name = "torque", .action_unit = "N*m",
        .state_unit = {"rad", "rad", "rad/s", "rad/s"},
        .obs_unit = {"1", "1", "1", "1", "rad/s", "rad/s"},
        .param_unit = {"m/s^2", "kg", "kg", "m", "m", "m", "m", "kg*m^2", "kg*m^2",
                       "N*m*s/rad", "N*m*s/rad", "N*m", "N*m", "kg*m^2", "1"},
        .is_angle = {1, 1, 0, 0}, .is_angular_velocity = {0, 0, 1, 1},
        .obs_index = {0, 2, 4, 5}, .cyclic = {0, 0, 0, 0},
        .pole_angle = 0, .pole_velocity = 2,
        /* what the joints reach in a 6 N m swing-up */
        .operating_range = {PI, PI, 20.0, 40.0},
        /* two encoders, continuous rotation, no default limits */
        .n_channels = 2, .channel_position = {0, 1}, .channel_velocity = {2, 3},
        .channel_pos_limit = {0.0, 0.0}, .channel_vel_limit = {0.0, 0.0}},
};

int plant_is_angle(int system, int k) { return LAYOUTS[system].is_angle[k]; }
int plant_is_angular_velocity(int system, int k) { return LAYOUTS[system].is_angular_velocity[k]; }

/* ------------------------------------------------------------------------
 * Names.
 * ---------------------------------------------------------------------- */
static const char *const SYSTEM_NAMES[PS_NUM_SYSTEMS] = {"pendulum", "cartpole", "furuta",
                                                          "double_pendulum"};
static const char *const PARAM_NAMES[PS_NUM_SYSTEMS][PS_MAX_PARAMS] = {
    {"g", "m", "l", "b", "fc", "com", "inertia"},
    {"g", "mc", "mp", "l"},
    {"g", "rm", "km", "mr", "lr", "jr", "dr", "mp", "lp", "jp", "dp"},
    {"g", "m1", "m2", "l1", "l2", "r1", "r2", "I1", "I2", "b1", "b2", "cf1", "cf2", "Ir", "gr"}};
static const char *const STATE_NAMES[PS_NUM_SYSTEMS][PS_MAX_NX] = {
    {"theta", "theta_dot"},
    {"x", "x_dot", "theta", "theta_dot"},
    {"theta", "alpha", "theta_dot", "alpha_dot"},
    {"theta1", "theta2", "theta1_dot", "theta2_dot"}};
static const char *const OBS_NAMES[PS_NUM_SYSTEMS][PS_MAX_NOBS] = {
    {"cos_theta", "sin_theta", "theta_dot"},
    {"x", "x_dot", "cos_theta", "sin_theta", "theta_dot"},
    {"cos_theta", "sin_theta", "cos_alpha", "sin_alpha", "theta_dot", "alpha_dot"},
    {"cos_theta1", "sin_theta1", "cos_theta2", "sin_theta2", "theta1_dot", "theta2_dot"}};
static const int NX[PS_NUM_SYSTEMS] = {2, 4, 4, 4};
static const int NOBS[PS_NUM_SYSTEMS] = {3, 5, 6, 6};
static const int NPARAM[PS_NUM_SYSTEMS] = {PS_PEND_NPARAM, PS_CP_NPARAM, PS_FU_NPARAM,
                                           PS_DP_NPARAM};

int ps_system_id(const char *name)
{
  for (int s = 0; s < PS_NUM_SYSTEMS; ++s)
    if (strcmp(name, SYSTEM_NAMES[s]) == 0) return s;
  return -1;
}

static int valid_system(int s) { return s >= 0 && s < PS_NUM_SYSTEMS; }
const char *ps_system_name(int s) { return valid_system(s) ? SYSTEM_NAMES[s] : 0; }
const char *ps_param_name(int s, int k)
{
  return valid_system(s) && k >= 0 && k < NPARAM[s] ? PARAM_NAMES[s][k] : 0;
}
const char *ps_obs_name(int s, int k)
{
  return valid_system(s) && k >= 0 && k < NOBS[s] ? OBS_NAMES[s][k] : 0;
}
const char *ps_state_name(int s, int k)
{
  return valid_system(s) && k >= 0 && k < NX[s] ? STATE_NAMES[s][k] : 0;
}

int ps_plant_layout(int s, ps_layout *layout)
{
  if (!valid_system(s)) return PS_ERR_SYSTEM;
  *layout = LAYOUTS[s];
  return PS_OK;
}

/* ------------------------------------------------------------------------
 * Presets.
 * ---------------------------------------------------------------------- */
static void base_model(ps_model *m, int system)
{
  memset(m, 0, sizeof *m);
  m->system = system;
  m->nx = NX[system];
  m->nobs = NOBS[system];
  m->nparam = NPARAM[system];
  m->substeps = 1;
  m->coulomb_vc = 0.01;
}

/* A uniform rod: centre of mass at l / 2, inertia m l^2 / 3 about the pivot. */
static void pendulum_rod(ps_model *m)
{
  m->param[PS_PEND_COM] = 0.5;
  m->param[PS_PEND_INERTIA] = 1.0 / 3.0;
}

/* Gymnasium's Pendulum-v1, exactly (a uniform rod). */
static void pendulum_gym(ps_model *m)
{
  pendulum_rod(m);
  m->param[PS_PEND_G] = 10.0;
  m->param[PS_PEND_M] = 1.0;
  m->param[PS_PEND_L] = 1.0;
  m->dt = 0.05;
  m->integrator = PS_SEMI_EULER;
  m->u_max = 2.0;
  m->v_max = 8.0;
  m->gym_precision = 1;
  m->reward_kind = PS_REWARD_QUADRATIC;
  m->w_x[0] = 1.0;
  m->w_x[1] = 0.1;
  m->w_u = 0.001;
  m->max_steps = 200;
  m->x0_low[0] = -PI;  m->x0_high[0] = PI;
  m->x0_low[1] = -1.0; m->x0_high[1] = 1.0;
}

/* A bench rig: a 30 cm, 150 g rod on a small geared DC motor with a 2048
 * count encoder, controlled at 200 Hz. The torque limit is below the peak
 * gravity torque m g l / 2 = 0.22 N m, so it must swing up. */
static void pendulum_rig(ps_model *m)
{
  pendulum_rod(m);
  m->param[PS_PEND_G] = 9.81;
  m->param[PS_PEND_M] = 0.15;
  m->param[PS_PEND_L] = 0.30;
  m->param[PS_PEND_B] = 0.002;
  m->param[PS_PEND_FC] = 0.004;
  m->dt = 0.005;
  m->substeps = 2;
  m->integrator = PS_RK4;
  m->u_max = 0.15;
  m->v_max = 40.0;
  m->reward_kind = PS_REWARD_QUADRATIC;
  m->w_x[0] = 1.0;
  m->w_x[1] = 0.01;
  m->w_u = 10.0;
  m->max_steps = 2000;
  m->x0_low[0] = PI - 0.1;  m->x0_high[0] = PI + 0.1;
  m->x0_low[1] = -0.1;      m->x0_high[1] = 0.1;
  m->enc_counts[0] = 2048;
}

/* RealAIGym's torque-limited simple pendulum benchmark (DFKI's
 * underactuated lab, torque_limited_simple_pendulum,
 * leaderboard/simulation/sim_parameters.py): a point mass of 0.57288 kg on
 * a massless 0.5 m rod, viscous damping 0.1 N m s, Coulomb friction
 * 0.093 N m with the exact sign of the velocity, torque limit 2 N m (below
 * the peak gravity torque m g l = 2.81 N m: it must swing up), RK4 at
 * dt = 0.01 s, 10 s (1000 steps) from hanging at rest, no velocity clip.
 * Angle convention: ours is zero upright; RealAIGym's q is zero hanging,
 * q = th + pi (mod 2 pi), same direction, same torque sign. Observation
 * [cos th, sin th, thd] as for every pendulum preset.
 * Reward (what GRPO maximises; the benchmark's score is computed from the
 * trajectory by grpo_ctrl.realaigym): -(th^2 + 0.1 thd^2 + 0.01 u^2), th
 * wrapped, chosen by measurement (docs/realaigym.md): a heavier torque
 * weight leaves the pendulum off the score's 0.02 rad region; a lighter
 * velocity weight (0.01) left 13-20 % of spinning starts unrecovered. */
static void pendulum_realaigym(ps_model *m)
{
  m->param[PS_PEND_G] = 9.81;
  m->param[PS_PEND_M] = 0.57288;
  m->param[PS_PEND_L] = 0.5;
  m->param[PS_PEND_B] = 0.10;
  m->param[PS_PEND_FC] = 0.093;
  m->param[PS_PEND_COM] = 1.0;
  m->param[PS_PEND_INERTIA] = 1.0;
  m->coulomb_vc = 0.0;
  m->dt = 0.01;
  m->substeps = 1;
  m->integrator = PS_RK4;
  m->u_max = 2.0;
  m->v_max = 0.0;
  m->reward_kind = PS_REWARD_QUADRATIC;
  m->w_x[0] = 1.0;
  m->w_x[1] = 0.1;
  m->w_u = 0.01;
  m->max_steps = 1000;
  m->x0_low[0] = PI; m->x0_high[0] = PI;
  m->x0_low[1] = 0.0; m->x0_high[1] = 0.0;
}

/* Gymnasium's CartPole-v1 constants and balance task, with the force as a
 * continuous input bounded by force_mag = 10 N. */
static void cartpole_gym(ps_model *m)
{
  m->param[PS_CP_G] = 9.8;
  m->param[PS_CP_MC] = 1.0;
  m->param[PS_CP_MP] = 0.1;
  m->param[PS_CP_L] = 0.5;
  m->dt = 0.02;
  m->integrator = PS_EULER;
  m->u_max = 10.0;
  m->reward_kind = PS_REWARD_ALIVE;
  m->term_limit[0] = 2.4;
  m->term_limit[2] = 12 * 2 * PI / 360;
  m->max_steps = 500;
  for (int k = 0; k < 4; ++k) { m->x0_low[k] = -0.05; m->x0_high[k] = 0.05; }
}

/* The same cart and pole, started hanging, to swing up and balance on a
 * 2.4 m half-track. Leaving the track ends the episode with a penalty worth
 * more than any trajectory can lose by staying on it. */
static void cartpole_swingup(ps_model *m)
{
  cartpole_gym(m);
  m->integrator = PS_RK4;
  m->reward_kind = PS_REWARD_QUADRATIC;
  m->w_x[0] = 0.1;  m->w_x[1] = 0.01; m->w_x[2] = 1.0; m->w_x[3] = 0.01;
  m->w_u = 0.001;
  m->term_limit[2] = 0.0;
  m->term_reward = -2000.0;
  m->max_steps = 500;
  m->x0_low[0] = -0.05;     m->x0_high[0] = 0.05;
  m->x0_low[1] = -0.05;     m->x0_high[1] = 0.05;
  m->x0_low[2] = PI - 0.05; m->x0_high[2] = PI + 0.05;
  m->x0_low[3] = -0.05;     m->x0_high[3] = 0.05;
}

/* Quanser Qube-Servo 2 with its rotary pendulum module; the parameters of
 * Quanser's Qube-Servo 2 user manual and courseware. Voltage limited to
 * +-10 V, 500 Hz control as in Quanser's examples, arm kept within
 * +-2 rad (the encoder cable's reach). */
static void furuta_qube(ps_model *m)
{
  const double mr = 0.095, lr = 0.085, mp = 0.024, lp = 0.129;
  m->param[PS_FU_G] = 9.81;
  m->param[PS_FU_RM] = 8.4;
  m->param[PS_FU_KM] = 0.042;
  m->param[PS_FU_MR] = mr;
  m->param[PS_FU_LR] = lr;
  m->param[PS_FU_JR] = mr * lr * lr / 12.0;
  m->param[PS_FU_DR] = 5e-6;
  m->param[PS_FU_MP] = mp;
  m->param[PS_FU_LP] = lp;
  m->param[PS_FU_JP] = mp * lp * lp / 12.0;
  m->param[PS_FU_DP] = 1e-6;
  m->dt = 0.002;
  m->substeps = 1;
  m->integrator = PS_RK4;
  m->u_max = 10.0;
  m->v_max = 0.0;
  m->reward_kind = PS_REWARD_QUADRATIC;
  m->w_x[0] = 0.2; m->w_x[1] = 1.0; m->w_x[2] = 0.002; m->w_x[3] = 0.002;
  m->w_u = 0.002;
  m->term_limit[0] = 2.0;
  m->term_reward = -5000.0;
  m->max_steps = 2500;
  m->x0_low[0] = -0.05;     m->x0_high[0] = 0.05;
  m->x0_low[1] = PI - 0.05; m->x0_high[1] = PI + 0.05;
  m->x0_low[2] = -0.05;     m->x0_high[2] = 0.05;
  m->x0_low[3] = -0.05;     m->x0_high[3] = 0.05;
  m->enc_counts[0] = 2048;
  m->enc_counts[1] = 2048;
}

typedef struct {
  int system;
  const char *name;
  void (*fill)(ps_model *m);
} preset;

static const preset PRESETS[] = {
    {PS_PENDULUM, "gym", pendulum_gym},
    {PS_PENDULUM, "rig", pendulum_rig},
    {PS_PENDULUM, "realaigym", pendulum_realaigym},
    {PS_CARTPOLE, "gym", cartpole_gym},
    {PS_CARTPOLE, "swingup", cartpole_swingup},
    {PS_FURUTA, "qube-servo2", furuta_qube},
    {PS_DOUBLE_PENDULUM, "acrobot", double_pendulum_acrobot},
    {PS_DOUBLE_PENDULUM, "pendubot", double_pendulum_pendubot},
    {PS_DOUBLE_PENDULUM, "acrobot-real", double_pendulum_acrobot_real},
    {PS_DOUBLE_PENDULUM, "pendubot-real", double_pendulum_pendubot_real},
};
static const int NUM_PRESETS = sizeof PRESETS / sizeof PRESETS[0];

int ps_num_presets(int system)
{
  int n = 0;
  for (int i = 0; i < NUM_PRESETS; ++i) n += PRESETS[i].system == system;
  return n;
}

const char *ps_preset_name(int system, int k)
{
  for (int i = 0; i < NUM_PRESETS; ++i)
    if (PRESETS[i].system == system && k-- == 0) return PRESETS[i].name;
  return 0;
}

int ps_model_init(ps_model *m, int system, const char *preset)
{
  if (!valid_system(system)) return PS_ERR_SYSTEM;
  for (int i = 0; i < NUM_PRESETS; ++i) {
    if (PRESETS[i].system == system && strcmp(PRESETS[i].name, preset) == 0) {
      base_model(m, system);
      PRESETS[i].fill(m);
      return PS_OK;
    }
  }
  return PS_ERR_PRESET;
}

/* Ranges a drawn plant can come from: ordered, finite, a plant that can be
 * simulated, a motor that responds, pushes that last. */
static int ranges_valid(const ps_model *m)
{
  const ps_plant_ranges *r = &m->ranges;
  for (int k = 0; k < m->nparam; ++k)
    if (!isfinite(r->param_lo[k]) || !isfinite(r->param_hi[k]) || r->param_lo[k] > r->param_hi[k])
      return 0;
  if (m->system == PS_DOUBLE_PENDULUM && !double_pendulum_ranges_valid(r->param_lo, r->param_hi))
    return 0;
  for (int k = 0; k < m->nx / 2; ++k)
    if (!isfinite(r->offset_lo[k]) || !isfinite(r->offset_hi[k]) || r->offset_lo[k] > r->offset_hi[k])
      return 0;
  return r->delay_lo >= 0 && r->delay_lo <= r->delay_hi && r->delay_hi <= PS_MAX_DELAY &&
         r->motor_k_lo > 0 && r->motor_k_lo <= r->motor_k_hi && r->motor_k_hi <= 1 &&
         r->torque_noise_lo >= 0 && r->torque_noise_lo <= r->torque_noise_hi &&
         isfinite(r->torque_noise_hi) && r->push_rate >= 0 && isfinite(r->push_rate) &&
         (r->push_rate == 0 || (r->push_steps >= 1 && r->push_lo >= 0 &&
                                r->push_lo <= r->push_hi && isfinite(r->push_hi)));
}

int ps_model_check(const ps_model *m)
{
  if (!valid_system(m->system)) return PS_ERR_SYSTEM;
  if (m->nx != NX[m->system] || m->nobs != NOBS[m->system] ||
      m->nparam != NPARAM[m->system])
    return PS_ERR_MODEL;
  if (!(m->dt > 0) || m->substeps < 1 || m->integrator < PS_EULER ||
      m->integrator > PS_RK4 || m->delay < 0 || m->delay > PS_MAX_DELAY ||
      !(m->u_max > 0) || m->v_max < 0 || !(m->coulomb_vc >= 0) || m->max_steps < 0 ||
      m->actuated < 0 || m->actuated > 1 || !(m->w_height >= 0) || !(m->w_down >= 0) ||
      !(m->w_power >= 0) || !isfinite(m->up_height) ||
      !(m->catch_level >= 0 && isfinite(m->catch_level)))
    return PS_ERR_MODEL;
  for (int k = 0; k < m->nx * m->nx; ++k)
    if (!isfinite(m->catch_P[k])) return PS_ERR_MODEL;
  for (int k = 0; k < m->nx; ++k)
    if (!isfinite(m->catch_K[k]) || m->enc_counts[k] < 0 || m->noise_std[k] < 0 ||
        m->x0_low[k] > m->x0_high[k])
      return PS_ERR_MODEL;
  if (m->plant_mode < PS_PLANT_NOMINAL || m->plant_mode > PS_PLANT_HOLD ||
      (m->plant_mode == PS_PLANT_DRAW && !ranges_valid(m)))
    return PS_ERR_MODEL;
  return PS_OK;
}
