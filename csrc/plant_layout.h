/*
 * The layout of each plant, for everything outside the simulator: names and
 * units of the state, observation, action and parameters, which state
 * components are angles, where the pendulum sits, the position sensors a rig
 * has and their default safety limits. The one home of a plant's layout:
 * Python's grpo_ctrl.plant reads it (and so the baselines, the export checks,
 * the HIL and the host), and the HIL back-end wires its sensors from it.
 * The tables live in plants.c next to the equations.
 */
#ifndef PENDSIM_PLANT_LAYOUT_H
#define PENDSIM_PLANT_LAYOUT_H

#include "pendsim.h"

#define PS_MAX_CHANNELS 2 /* most position sensors of one plant */

typedef struct {
  const char *action_name;              /* "torque", "force", "voltage" */
  const char *action_unit;              /* "N*m", "N", "V" */
  const char *state_unit[PS_MAX_NX];
  const char *obs_unit[PS_MAX_NOBS];
  const char *param_unit[PS_MAX_PARAMS];
  int is_angle[PS_MAX_NX];              /* wrapped for rewards, observed as (cos, sin) */
  int is_angular_velocity[PS_MAX_NX];   /* clipped by the model's v_max */
  int obs_index[PS_MAX_NX];             /* where component k enters the observation;
                                           an angle's cosine, its sine next */
  int cyclic[PS_MAX_NX];                /* does not enter the dynamics (cart
                                           position, arm angle) */
  int pole_angle, pole_velocity;        /* state indices of the pendulum's angle
                                           and angular velocity */
  double operating_range[PS_MAX_NX];    /* |x_k| a rig reaches in use: the range
                                           export checks sample (a preset's v_max
                                           or termination limit takes precedence) */
  int n_channels;                       /* position sensors of a rig */
  int channel_position[PS_MAX_CHANNELS]; /* state index each sensor reads ... */
  int channel_velocity[PS_MAX_CHANNELS]; /* ... and of that position's rate */
  double channel_pos_limit[PS_MAX_CHANNELS]; /* a rig's default safety limits, */
  double channel_vel_limit[PS_MAX_CHANNELS]; /* rad or m (per s), 0 = none */
} ps_layout;

/* Fill *layout for system; PS_OK, or PS_ERR_SYSTEM if unknown. */
int ps_plant_layout(int system, ps_layout *layout);

/* The observation [nobs] of one state x [nx]: the function ps_step and
 * ps_observe use, without sensor noise or quantisation. A rig's host builds
 * its observations with it, so the simulator and the rig cannot disagree. */
void ps_observation(int system, const double *x, float *obs);

#endif /* PENDSIM_PLANT_LAYOUT_H */
