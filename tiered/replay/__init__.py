"""tiered replay: the archive served to unmodified RocketMQ clients over the 4.x remoting protocol."""
