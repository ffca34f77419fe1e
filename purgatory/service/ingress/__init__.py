"""Where inputs enter: Kafka records and HTTP requests in, decoded inputs out to dispatch.

It takes the consumed records of the requests and signals topics (``intake``: decode, dead-letter
what cannot be read, hand each poll to dispatch in order) and HTTP requests (``http``: routes,
request reading, the route table, the server's limits, OpenAPI, auth), and gives
:mod:`purgatory.service.dispatch` decoded inputs, and the caller an answer once the journal
has them.
"""
