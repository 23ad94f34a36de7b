/* Internal: the plants' right-hand sides and energies, for pendsim.c. */
#ifndef PENDSIM_PLANTS_H
#define PENDSIM_PLANTS_H

#include "pendsim.h"

/* xdot = f(x, u) for one environment with parameter vector p (contiguous). */
void plant_dynamics(const ps_model *m, const double *p, const double *x, double u,
                    double *xdot);
double plant_energy(const ps_model *m, const double *p, const double *x);
/* Height of the plant's tip over its reach: 1 upright, -1 hanging. */
double plant_height(const ps_model *m, const double *p, const double *x);
/* Velocity of the joint (or cart) the actuator drives. */
double plant_driven_velocity(const ps_model *m, const double *x);
int plant_is_angle(int system, int k);
int plant_is_angular_velocity(int system, int k);

#endif
