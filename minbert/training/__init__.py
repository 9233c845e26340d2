"""Training: the loop and its steps, stages and schedules, the regularisers (SMART, EWC, L2-SP, LNSR), gradient
surgery, distillation, the MLM stage, the state saved for resuming and the step logs."""
