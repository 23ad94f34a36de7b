/*
 * The exported controller as the firmware core's on-device controller.
 * `grpo-ctrl firmware --policy` puts policy.c and policy.h into the project;
 * where they are, BOARD_CONTROLLER is the fw_hw.controller to give fw_init,
 * else 0 (no on-device control: the host refuses to select it).
 */
#ifndef GRPO_POLICY_LINK_H
#define GRPO_POLICY_LINK_H

#if defined(__has_include)
#if __has_include("policy.h")
#include "policy.h"
static int board_run_policy(void *ctx, const float *obs, float *action)
{
  (void)ctx;
  return policy_step(obs, action);
}
#define BOARD_CONTROLLER board_run_policy
#endif
#endif
#ifndef BOARD_CONTROLLER
#define BOARD_CONTROLLER 0
#endif

#endif /* GRPO_POLICY_LINK_H */
