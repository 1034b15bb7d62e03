"""`oomguard doctor`: what evidence of worker deaths this host lets oomguard collect."""
