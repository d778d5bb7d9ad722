// The no-op task: the same work as oncely's no-op handler (none).
module.exports = async () => {};
