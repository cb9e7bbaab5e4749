-- The schema's completion key (version 31): HMAC-SHA256's inner and outer pads, with which
-- a worker computes the token of each attempt it starts.
SELECT ipad, opad FROM completion_key
