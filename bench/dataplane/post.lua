-- seed 003 "tea POST method based routing": wrk sends POST /tea with a small form body.
wrk.method = "POST"
wrk.body = "order=tea&size=large"
wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
