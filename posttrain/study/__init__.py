"""Studies: experiments that run several recipes from one start and compare them (`posttrain study`)."""
