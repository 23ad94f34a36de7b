/*
 * The double pendulum (RealAIGym's acrobot and pendubot), for plants.c.
 *
 * Internal: static functions that plants.c includes once, so that the plant
 * layer stays the two translation units (pendsim.c, plants.c) that every
 * build (the Python extension, the HIL, the boards, the sanitizer tests)
 * already compiles.
 *
 * State [th1, th2, th1d, th2d]: th1 the shoulder angle, zero UPRIGHT; th2
 * the elbow angle relative to link 1, zero when the links are in line; both
 * counter-clockwise positive. Observation [cos th1, sin th1, cos th2,
 * sin th2, th1d, th2d]. Action: the torque (N m) of the one motor, on the
 * shoulder (pendubot) or the elbow (acrobot), as the model's `actuated`
 * says; the other joint is passive.
 *
 * Equations: the manipulator form of DFKI's double_pendulum package
 * (src/python/double_pendulum/model/plant.py, "UnderactuatedLecture"), with
 * link inertias I1, I2 about the joint axes, centres of mass at r1, r2 from
 * them, a motor of rotor inertia Ir behind a gear of ratio gr:
 *   M(th2) thdd + C(th, thd) thd = G(th) + B tau - F(thd)
 *   M11 = I1 + I2 + m2 l1^2 + 2 m2 l1 r2 cos th2 + gr^2 Ir + Ir
 *   M12 = M21 = I2 + m2 l1 r2 cos th2 - gr Ir,  M22 = I2 + gr^2 Ir
 *   C thd = m2 l1 r2 sin th2 [-2 th1d th2d - th2d^2, th1d^2]
 *   F_i = b_i thd_i + cf_i atan(thd_i / vc)   (vc: the model's coulomb_vc;
 *         RealAIGym's atan(100 v), vc = 0.01; vc = 0: pi/2 sign(v))
 * Their shoulder angle q1 is zero hanging: q1 = th1 + pi, so their gravity
 * vector -g [m1 r1 sin q1 + m2 (l1 sin q1 + r2 sin(q1 + q2)),
 * m2 r2 sin(q1 + q2)] becomes, here,
 *   G = g [m1 r1 sin th1 + m2 (l1 sin th1 + r2 sin(th1 + th2)),
 *          m2 r2 sin(th1 + th2)].
 * l2 does not enter the dynamics: it places the end effector, whose height
 * the leaderboard's success criterion and the reward read.
 */
#ifndef PENDSIM_PLANT_DOUBLE_H
#define PENDSIM_PLANT_DOUBLE_H

#include <math.h>

#include "pendsim.h"

static double double_coulomb_shape(const ps_model *m, double v)
{
  if (m->coulomb_vc > 0) return atan(v / m->coulomb_vc);
  return 0.5 * 3.14159265358979323846 * (double)((v > 0) - (v < 0));
}

static void double_pendulum_f(const ps_model *m, const double *p, const double *x, double u,
                              double *xdot)
{
  const double g = p[PS_DP_G], m1 = p[PS_DP_M1], m2 = p[PS_DP_M2], l1 = p[PS_DP_L1];
  const double r1 = p[PS_DP_R1], r2 = p[PS_DP_R2], I1 = p[PS_DP_I1], I2 = p[PS_DP_I2];
  const double Ir = p[PS_DP_IR], gr = p[PS_DP_GR];
  const double th1d = x[2], th2d = x[3];
  const double s1 = sin(x[0]), s2 = sin(x[1]), c2 = cos(x[1]), s12 = sin(x[0] + x[1]);
  const double h = m2 * l1 * r2;
  const double m11 = I1 + I2 + m2 * l1 * l1 + 2.0 * h * c2 + gr * gr * Ir + Ir;
  const double m12 = I2 + h * c2 - gr * Ir;
  const double m22 = I2 + gr * gr * Ir;
  const double tau1 = m->actuated == 0 ? u : 0.0, tau2 = m->actuated == 1 ? u : 0.0;
  const double f1 = g * (m1 * r1 * s1 + m2 * (l1 * s1 + r2 * s12)) + tau1 +
                    h * s2 * (2.0 * th1d * th2d + th2d * th2d) - p[PS_DP_B1] * th1d -
                    p[PS_DP_CF1] * double_coulomb_shape(m, th1d);
  const double f2 = g * m2 * r2 * s12 + tau2 - h * s2 * th1d * th1d - p[PS_DP_B2] * th2d -
                    p[PS_DP_CF2] * double_coulomb_shape(m, th2d);
  const double det = m11 * m22 - m12 * m12;
  xdot[0] = th1d;
  xdot[1] = th2d;
  xdot[2] = (m22 * f1 - m12 * f2) / det;
  xdot[3] = (m11 * f2 - m12 * f1) / det;
}

/* Kinetic energy 0.5 thd' M thd plus the potential energy of both links,
 * zero when hanging at rest. */
static double double_pendulum_energy(const double *p, const double *x)
{
  const double g = p[PS_DP_G], m1 = p[PS_DP_M1], m2 = p[PS_DP_M2], l1 = p[PS_DP_L1];
  const double r1 = p[PS_DP_R1], r2 = p[PS_DP_R2], I1 = p[PS_DP_I1], I2 = p[PS_DP_I2];
  const double Ir = p[PS_DP_IR], gr = p[PS_DP_GR];
  const double c1 = cos(x[0]), c2 = cos(x[1]), c12 = cos(x[0] + x[1]);
  const double h = m2 * l1 * r2;
  const double m11 = I1 + I2 + m2 * l1 * l1 + 2.0 * h * c2 + gr * gr * Ir + Ir;
  const double m12 = I2 + h * c2 - gr * Ir;
  const double m22 = I2 + gr * gr * Ir;
  const double kinetic =
      0.5 * (m11 * x[2] * x[2] + 2.0 * m12 * x[2] * x[3] + m22 * x[3] * x[3]);
  return kinetic + g * (m1 * r1 * (1.0 + c1) + m2 * (l1 * (1.0 + c1) + r2 * (1.0 + c12)));
}

/* Height of the end effector above the shoulder, over its reach l1 + l2:
 * 1 upright, -1 hanging. */
static double double_pendulum_height(const double *p, const double *x)
{
  const double l1 = p[PS_DP_L1], l2 = p[PS_DP_L2];
  return (l1 * cos(x[0]) + l2 * cos(x[0] + x[1])) / (l1 + l2);
}

/* Can every plant drawn from these ranges be simulated? The mass matrix
 * is M0 + Ir [[gr^2 + 1, -gr], [-gr, gr^2]], the second term positive
 * semi-definite, so M is positive definite where M0 is: I2 > 0 and
 *   det M0 = I1 I2 + m2 l1^2 (I2 - m2 r2^2 cos^2 th2) > 0.
 * Inertias about the joints below the parallel-axis bound (I2 < m2 r2^2, as
 * independent draws of I2, m2 and r2 can give) may break it. det M0 grows
 * with I1 and I2, falls with |r2|, is linear in l1^2 and concave in m2: its
 * least over the box is at I1, I2 low, |r2| high, cos^2 th2 = 1 and a corner
 * of (m2, l1). */
static int double_pendulum_ranges_valid(const double *lo, const double *hi)
{
  const double I1 = lo[PS_DP_I1], I2 = lo[PS_DP_I2];
  const double r2 = fmax(fabs(lo[PS_DP_R2]), fabs(hi[PS_DP_R2]));
  if (!(I1 >= 0 && I2 > 0)) return 0;
  for (int corner = 0; corner < 4; ++corner) {
    const double m2 = corner & 1 ? hi[PS_DP_M2] : lo[PS_DP_M2];
    const double l1 = corner & 2 ? hi[PS_DP_L1] : lo[PS_DP_L1];
    if (!(I1 * I2 + m2 * l1 * l1 * (I2 - m2 * r2 * r2) > 0)) return 0;
  }
  return lo[PS_DP_IR] >= 0;
}

/* ------------------------------------------------------------------------
 * Presets. The simulation leaderboard v2 of RealAIGym (leaderboard/<robot>/
 * simulation_v2/sim_parameters.py): design C.1's identified model_1.0
 * (data/system_identification/identified_parameters/design_C.1/model_1.0/
 * model_parameters.yml) with damping, Coulomb friction and motor inertia set
 * to 0 and a 6 N m limit on the motor (0 on the passive joint: here, the one
 * action drives only the actuated joint), RK4 at dt = 0.002 s, 10 s (5000
 * steps) from hanging exactly at rest. The "-real" presets keep the
 * identified friction and the motor's rotor inertia behind its 6:1 gear.
 * Reward (PS_REWARD_HEIGHT), the leaderboard's score step by step: its
 * criteria's rates per second over their normalisers (swing-up time 20 s,
 * torque cost 20 N^2 m^2 s, velocity cost 400 rad^2/s, energy 60 J). A step
 * begun below 0.9 of the reach costs 1 (the swing-up time; the score's
 * success is staying above it); the costs of effort are 0.3 of the score's
 * ratios to it: u^2 0.3, each joint's velocity^2 0.015, the motor's power
 * |u v| 0.1. At the full ratios a swing-up costs more within a branch's
 * 1.2 s than staying down, and training loses it (docs/double_pendulum.md).
 * The height shaping w_height (1 - h) leads the way up; the torque's
 * smoothness is the trainer's (w_du, w_smooth).
 * ---------------------------------------------------------------------- */
static void double_pendulum_base(ps_model *m)
{
  m->param[PS_DP_G] = 9.81;
  m->param[PS_DP_M1] = 0.5234602302310271;
  m->param[PS_DP_M2] = 0.6255677234174437;
  m->param[PS_DP_L1] = 0.2;
  m->param[PS_DP_L2] = 0.3;
  m->param[PS_DP_R1] = 0.2;
  m->param[PS_DP_R2] = 0.25569305436052964;
  m->param[PS_DP_I1] = 0.031887199591513114;
  m->param[PS_DP_I2] = 0.05086984812807257;
  m->param[PS_DP_GR] = 6.0;
  /* friction and motor inertia: 0 in the simulation leaderboard */
  m->coulomb_vc = 0.01; /* RealAIGym's atan(100 v) */
  m->dt = 0.002;
  m->substeps = 1;
  m->integrator = PS_RK4;
  m->u_max = 6.0;
  m->v_max = 0.0;
  m->reward_kind = PS_REWARD_HEIGHT;
  m->w_height = 1.0;
  m->w_down = 1.0;
  m->up_height = 0.9;
  m->w_u = 0.3;
  m->w_x[2] = 0.3 / 20.0;
  m->w_x[3] = 0.3 / 20.0;
  m->w_power = 0.1;
  m->max_steps = 5000;
  m->x0_low[0] = PI; m->x0_high[0] = PI; /* hanging at rest */
}

static void double_pendulum_real(ps_model *m)
{
  m->param[PS_DP_B1] = 0.001;
  m->param[PS_DP_B2] = 0.001;
  m->param[PS_DP_CF1] = 0.16;
  m->param[PS_DP_CF2] = 0.12;
  m->param[PS_DP_IR] = 6.287203962819607e-05;
}

static void double_pendulum_acrobot(ps_model *m)
{
  double_pendulum_base(m);
  m->actuated = 1;
}

static void double_pendulum_pendubot(ps_model *m)
{
  double_pendulum_base(m);
  m->actuated = 0;
}

static void double_pendulum_acrobot_real(ps_model *m)
{
  double_pendulum_acrobot(m);
  double_pendulum_real(m);
}

static void double_pendulum_pendubot_real(ps_model *m)
{
  double_pendulum_pendubot(m);
  double_pendulum_real(m);
}

#endif /* PENDSIM_PLANT_DOUBLE_H */
