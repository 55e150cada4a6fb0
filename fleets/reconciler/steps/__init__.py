"""The operations' step executors: the promotion's, the demotion's, the drill's, and the clean-up
after a failed promotion; `base` holds what every executor shares, `posture` the standby posture
they put a domain in."""
