"""Pure domain: events, the fold, the ownership state machine and the policy. No I/O."""
