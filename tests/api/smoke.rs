use crate::both_backends;
use crate::helpers::*;

both_backends! {
    fn a_created_order_can_be_read_back(backend) {
        let app = TestApp::spawn(backend);
        let created = app.post_order(Some("smoke-1"), &order_body("Widget", 2, "9.99"));
        assert_eq!(created.status, 201, "{}", created.body);
        let location = created.header("Location").expect("Location").to_owned();
        let read = app.call("GET", &location, None, None);
        assert_eq!(read.status, 200);
        assert_eq!(read.json(), created.json());
        assert_eq!(app.order_count(), 1);
    }
}
